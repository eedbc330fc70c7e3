// Where each queued kernel came from: the innermost Python frame outside torch and
// torch_neuronx when it was launched (the user's line, not torch.nn.functional's), so an
// asynchronous kernel error raised at a later synchronization names it.
//
// Ops run with the GIL released (PyTorch's bindings drop it around every op), and taking it back
// per op would stall behind any other Python thread (a DataLoader's pin-memory thread) for up to
// the interpreter's switch interval. So capture reads the launching thread's own frame stack
// without the GIL: that thread is inside this call, so its frames, and the code objects they
// run, cannot change or go away meanwhile; capture only reads them (no reference counts, no
// caches filled), and keeps what it learns in a table of its own, under a mutex. "file:line" is
// computed once per (code object, instruction) and resolving a token is a table read.
// Code objects are not kept alive: a table entry remembers the identity of the code it was made
// for (file, first line, name), and a different code object at a reused address replaces it.
// Work launched from threads without a Python frame (autograd's engine) has no origin.
#include <Python.h>

#if PY_VERSION_HEX >= 0x030B0000 && PY_VERSION_HEX < 0x030C0000
#define NEURONX_READ_FRAMES 1
#define Py_BUILD_CORE
#include <internal/pycore_frame.h>
#undef Py_BUILD_CORE
#endif

#include <cstdlib>
#include <filesystem>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "backend/op_origin.h"
#include "runtime/queue.h"

namespace neuronx {

namespace {

constexpr size_t kMaxOrigins = 1 << 20;
constexpr int kMaxDepth = 64;

struct CodeEntry {
  PyObject* filename = nullptr;  // the identity of the code object the entry was made for
  PyObject* qualname = nullptr;
  int firstlineno = 0;
  bool library = false;                                // in torch's or torch_neuronx's files
  std::unordered_map<int, uint64_t> by_instruction;    // instruction index -> token
};

std::mutex g_mu;
std::unordered_map<const PyCodeObject*, CodeEntry> g_codes;
std::vector<std::string> g_texts;  // token - 1 -> "file:line"
std::vector<std::string> g_library_dirs;

// A str's text by reading it only (PyUnicode_AsUTF8 would fill the object's cache).
std::string read_str(PyObject* s) {
  if (!s || !PyUnicode_Check(s)) return "<unknown>";
  if (PyUnicode_IS_COMPACT_ASCII(s)) return std::string(static_cast<const char*>(PyUnicode_DATA(s)),
                                                        static_cast<size_t>(PyUnicode_GET_LENGTH(s)));
  std::string out;
  const int kind = PyUnicode_KIND(s);
  const void* data = PyUnicode_DATA(s);
  for (Py_ssize_t i = 0; i < PyUnicode_GET_LENGTH(s); ++i) {
    const Py_UCS4 c = PyUnicode_READ(kind, data, i);
    if (c < 0x80) {
      out += static_cast<char>(c);
    } else if (c < 0x800) {
      out += static_cast<char>(0xC0 | (c >> 6));
      out += static_cast<char>(0x80 | (c & 0x3F));
    } else if (c < 0x10000) {
      out += static_cast<char>(0xE0 | (c >> 12));
      out += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (c & 0x3F));
    } else {
      out += static_cast<char>(0xF0 | (c >> 18));
      out += static_cast<char>(0x80 | ((c >> 12) & 0x3F));
      out += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (c & 0x3F));
    }
  }
  return out;
}

// Under g_mu.
CodeEntry& entry_of(const PyCodeObject* code) {
  CodeEntry& e = g_codes[code];
  if (e.filename != code->co_filename || e.qualname != code->co_qualname || e.firstlineno != code->co_firstlineno) {
    e = CodeEntry{code->co_filename, code->co_qualname, code->co_firstlineno};
    const std::string file = read_str(code->co_filename);
    for (const auto& dir : g_library_dirs)
      if (std::string_view(file).substr(0, dir.size()) == dir) e.library = true;
  }
  return e;
}

// Under g_mu.
uint64_t token_of(PyCodeObject* code, CodeEntry& e, int instruction) {
  auto it = e.by_instruction.find(instruction);
  if (it != e.by_instruction.end()) return it->second;
  if (g_texts.size() >= kMaxOrigins) return 0;
  const int line = PyCode_Addr2Line(code, instruction * static_cast<int>(sizeof(_Py_CODEUNIT)));
  g_texts.push_back(read_str(code->co_filename) + ":" + std::to_string(line));
  return e.by_instruction[instruction] = g_texts.size();
}

#ifdef NEURONX_READ_FRAMES
// What one (code object, instruction) resolved to, remembered per thread so that a loop launching
// from the same lines takes no lock: the table's entries are never removed or renumbered.
struct Seen {
  const PyCodeObject* code = nullptr;
  PyObject* filename = nullptr;
  PyObject* qualname = nullptr;
  int firstlineno = 0, instruction = -1;
  bool library = false;
  uint64_t token = 0;  // 0 for library frames below the innermost (never resolved)
};

// The token of frame f (at `depth`), and whether its code is the library's.
std::pair<uint64_t, bool> frame_token(_PyInterpreterFrame* f, int depth) {
  thread_local Seen seen[64];
  PyCodeObject* code = f->f_code;
  const int instruction = _PyInterpreterFrame_LASTI(f);
  Seen& s = seen[(reinterpret_cast<uintptr_t>(code) >> 4 ^ static_cast<uintptr_t>(instruction)) & 63];
  if (s.code == code && s.instruction == instruction && s.filename == code->co_filename &&
      s.qualname == code->co_qualname && s.firstlineno == code->co_firstlineno && (!s.library || s.token || depth))
    return {s.token, s.library};
  std::lock_guard<std::mutex> g(g_mu);
  CodeEntry& e = entry_of(code);
  const uint64_t token = !e.library || depth == 0 ? token_of(code, e, instruction) : 0;
  s = Seen{code, code->co_filename, code->co_qualname, code->co_firstlineno, instruction, e.library, token};
  return {token, e.library};
}
#endif

uint64_t capture() {
#ifdef NEURONX_READ_FRAMES
  if (!Py_IsInitialized()) return 0;
  PyThreadState* ts = PyGILState_GetThisThreadState();  // this thread's, whether it holds the GIL or not
  if (!ts || !ts->cframe) return 0;
  uint64_t innermost = 0;
  int depth = 0;
  for (_PyInterpreterFrame* f = ts->cframe->current_frame; f && depth < kMaxDepth; f = f->previous) {
    if (_PyFrame_IsIncomplete(f)) continue;  // a frame still being set up runs no user code yet
    const auto [token, library] = frame_token(f, depth);
    if (!library) return token;
    if (depth == 0) innermost = token;
    ++depth;
  }
  return innermost;  // only torch's own frames: the innermost of them
#else
  return 0;
#endif
}

std::string resolve(uint64_t token) {
  std::lock_guard<std::mutex> g(g_mu);
  return token >= 1 && token <= g_texts.size() ? g_texts[token - 1] : std::string();
}

}  // namespace

void install_op_origins() {
  if (const char* v = std::getenv("TORCH_NEURONX_OP_ORIGINS"); v && std::string(v) == "0") return;
  std::vector<std::string> dirs;
  for (const char* mod : {"torch", "torch_neuronx"}) {
    PyObject* m = PyImport_ImportModule(mod);  // (torch_neuronx: the package importing us)
    PyObject* file = m ? PyObject_GetAttrString(m, "__file__") : nullptr;
    const char* path = file ? PyUnicode_AsUTF8(file) : nullptr;
    if (path) dirs.push_back(std::filesystem::path(path).parent_path().string() + "/");
    Py_XDECREF(file);
    Py_XDECREF(m);
    if (!path) PyErr_Clear();
  }
  {
    std::lock_guard<std::mutex> g(g_mu);
    g_library_dirs = std::move(dirs);
  }
  rt::set_origin_hooks(&capture, &resolve);
}

}  // namespace neuronx
