// Environment parsing: parse_bytes, parse_core_list, parse_positive_int,
// make_config. Parsers are strict and name the variable in their errors.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "runtime/config.h"
#include "runtime/error.h"
#include "test_util.h"

namespace rt = neuronx::rt;
using rt::ErrorCode;

namespace {

constexpr size_t KiB = size_t{1} << 10;
constexpr size_t MiB = size_t{1} << 20;
constexpr size_t GiB = size_t{1} << 30;

// ---------------------------------------------------------------- parse_bytes

TEST(ParseBytes, UnitsAndSpellings) {
  EXPECT_EQ(rt::parse_bytes("X", "16GiB"), size_t{16} << 30);
  EXPECT_EQ(rt::parse_bytes("X", "16G"), 16 * GiB);
  EXPECT_EQ(rt::parse_bytes("X", "16gb"), 16 * GiB);
  EXPECT_EQ(rt::parse_bytes("X", "512MiB"), 512 * MiB);
  EXPECT_EQ(rt::parse_bytes("X", "512m"), 512 * MiB);
  EXPECT_EQ(rt::parse_bytes("X", "512MB"), 512 * MiB);
  EXPECT_EQ(rt::parse_bytes("X", "4KiB"), 4 * KiB);
  EXPECT_EQ(rt::parse_bytes("X", "4k"), 4 * KiB);
  EXPECT_EQ(rt::parse_bytes("X", "2TiB"), size_t{2} << 40);
  EXPECT_EQ(rt::parse_bytes("X", "4096"), size_t{4096});
  EXPECT_EQ(rt::parse_bytes("X", "4096B"), size_t{4096});
  EXPECT_EQ(rt::parse_bytes("X", "1"), size_t{1});
}

TEST(ParseBytes, FractionsAndWhitespace) {
  EXPECT_EQ(rt::parse_bytes("X", "1.5GiB"), 3 * GiB / 2);
  EXPECT_EQ(rt::parse_bytes("X", "0.5K"), size_t{512});
  EXPECT_EQ(rt::parse_bytes("X", "  8 GiB \t"), 8 * GiB);
  EXPECT_EQ(rt::parse_bytes("X", "8 gib"), 8 * GiB);
}

TEST(ParseBytes, RejectsBadValuesNamingTheVariable) {
  for (const char* bad : {"", "   ", "GiB", "-1", "-1GiB", "abc", "16XB", "16 GiBs", "1.2.3G",
                          "0", "0GiB", "0.5", "1e9", "16 G iB", "0x10", "2000000TiB"}) {
    SCOPED_TRACE(bad);
    EXPECT_RT_ERROR(rt::parse_bytes("TORCH_NEURONX_SIM_HBM", bad), ErrorCode::kInvalidArgument,
                    "TORCH_NEURONX_SIM_HBM", "'" + std::string(bad) + "'", "16GiB");
  }
}

TEST(ParseBytes, MalformedNumbersThrowRtErrorNotStdExceptions) {
  // A lone '.' passes the digit scan; an over-long digit string overflows a
  // double. Both must surface as the documented rt::Error, not std::stod's.
  EXPECT_RT_ERROR(rt::parse_bytes("TORCH_NEURONX_SIM_HBM", "."), ErrorCode::kInvalidArgument,
                  "TORCH_NEURONX_SIM_HBM");
  EXPECT_RT_ERROR(rt::parse_bytes("TORCH_NEURONX_SIM_HBM", ".GiB"), ErrorCode::kInvalidArgument,
                  "TORCH_NEURONX_SIM_HBM");
  EXPECT_RT_ERROR(rt::parse_bytes("TORCH_NEURONX_SIM_HBM", "1" + std::string(400, '0')),
                  ErrorCode::kInvalidArgument, "TORCH_NEURONX_SIM_HBM");
}

// ---------------------------------------------------------------- parse_core_list

TEST(ParseCoreList, SinglesRangesAndLists) {
  using V = std::vector<int>;
  EXPECT_EQ(rt::parse_core_list("V", "1-3", 4), (V{1, 2, 3}));
  EXPECT_EQ(rt::parse_core_list("V", "0", 4), (V{0}));
  EXPECT_EQ(rt::parse_core_list("V", "3", 4), (V{3}));
  EXPECT_EQ(rt::parse_core_list("V", "0,2", 4), (V{0, 2}));
  EXPECT_EQ(rt::parse_core_list("V", "2,0", 4), (V{2, 0}));  // order is kept
  EXPECT_EQ(rt::parse_core_list("V", "0-1,3", 4), (V{0, 1, 3}));
  EXPECT_EQ(rt::parse_core_list("V", " 1 - 2 , 0 ", 4), (V{1, 2, 0}));
  EXPECT_EQ(rt::parse_core_list("V", "2-2", 4), (V{2}));
  EXPECT_EQ(rt::parse_core_list("V", "0-7", 8), (V{0, 1, 2, 3, 4, 5, 6, 7}));
}

TEST(ParseCoreList, RejectsDuplicates) {
  EXPECT_RT_ERROR(rt::parse_core_list("NEURON_RT_VISIBLE_CORES", "1,1", 4),
                  ErrorCode::kInvalidArgument, "NEURON_RT_VISIBLE_CORES", "core 1 is listed twice");
  EXPECT_RT_ERROR(rt::parse_core_list("NEURON_RT_VISIBLE_CORES", "0-2,2", 4),
                  ErrorCode::kInvalidArgument, "NEURON_RT_VISIBLE_CORES", "core 2 is listed twice");
  EXPECT_RT_ERROR(rt::parse_core_list("NEURON_RT_VISIBLE_CORES", "0-2,1-3", 4),
                  ErrorCode::kInvalidArgument, "core 1 is listed twice");
}

TEST(ParseCoreList, RejectsOutOfRangeAndMalformed) {
  for (const char* bad : {"4", "0-4", "3,4", "", " ", "-", "-1", "1-", "-2", "3-1", "a", "1,",
                          ",1", "1,,2", "1-2-3", "1.5", "0x1", "1 2"}) {
    SCOPED_TRACE(bad);
    EXPECT_RT_ERROR(rt::parse_core_list("NEURON_RT_VISIBLE_CORES", bad, 4),
                    ErrorCode::kInvalidArgument, "NEURON_RT_VISIBLE_CORES",
                    "'" + std::string(bad) + "'");
  }
  // The message says what the bound is.
  EXPECT_RT_ERROR(rt::parse_core_list("NEURON_RT_VISIBLE_CORES", "4", 4),
                  ErrorCode::kInvalidArgument, "each below 4", "TORCH_NEURONX_SIM_CORES");
}

// ---------------------------------------------------------------- parse_positive_int

TEST(ParsePositiveInt, AcceptsRange) {
  EXPECT_EQ(rt::parse_positive_int("N", "1", 64), 1);
  EXPECT_EQ(rt::parse_positive_int("N", "64", 64), 64);
  EXPECT_EQ(rt::parse_positive_int("N", " 8 ", 64), 8);
  EXPECT_EQ(rt::parse_positive_int("N", "007", 64), 7);
}

TEST(ParsePositiveInt, Rejects) {
  for (const char* bad : {"0", "65", "-1", "+1", "", "1.0", "two", "9999999", "1e2"}) {
    SCOPED_TRACE(bad);
    EXPECT_RT_ERROR(rt::parse_positive_int("TORCH_NEURONX_SIM_CORES", bad, 64),
                    ErrorCode::kInvalidArgument, "TORCH_NEURONX_SIM_CORES");
  }
  EXPECT_RT_ERROR(rt::parse_positive_int("TORCH_NEURONX_SIM_CORES", "65", 64),
                  ErrorCode::kInvalidArgument, "between 1 and 64");
}

// ---------------------------------------------------------------- make_config

TEST(MakeConfig, Defaults) {
  rt::Config c = rt::make_config(nullptr, nullptr, nullptr, nullptr, 0);
  EXPECT_TRUE(c.error.empty()) << c.error;
  EXPECT_EQ(c.sim_cores, 2);
  EXPECT_EQ(c.visible, (std::vector<int>{0, 1}));
  EXPECT_EQ(c.hbm_bytes, 16 * GiB);
  EXPECT_FALSE(c.launch_blocking);

  // Empty strings mean unset.
  rt::Config e = rt::make_config("", "", "", "", 0);
  EXPECT_TRUE(e.error.empty()) << e.error;
  EXPECT_EQ(e.visible, (std::vector<int>{0, 1}));
  EXPECT_EQ(e.hbm_bytes, 16 * GiB);
}

TEST(MakeConfig, ExplicitValues) {
  rt::Config c = rt::make_config("4", "1-3", "1GiB", "1", 64 * GiB);
  EXPECT_TRUE(c.error.empty()) << c.error;
  EXPECT_EQ(c.sim_cores, 4);
  EXPECT_EQ(c.visible, (std::vector<int>{1, 2, 3}));
  EXPECT_EQ(c.hbm_bytes, 1 * GiB);
  EXPECT_TRUE(c.launch_blocking);

  rt::Config d = rt::make_config("8", nullptr, nullptr, "0", 0);
  EXPECT_EQ(d.visible, (std::vector<int>{0, 1, 2, 3, 4, 5, 6, 7}));
  EXPECT_FALSE(d.launch_blocking);
}

TEST(MakeConfig, HbmClampedToHostMemory) {
  // Host smaller than the default 16 GiB: clamp.
  EXPECT_EQ(rt::make_config(nullptr, nullptr, nullptr, nullptr, 8 * GiB).hbm_bytes, 8 * GiB);
  // Host smaller than an explicit value: clamp.
  EXPECT_EQ(rt::make_config(nullptr, nullptr, "32GiB", nullptr, 4 * GiB).hbm_bytes, 4 * GiB);
  // Host larger: keep the requested value.
  EXPECT_EQ(rt::make_config(nullptr, nullptr, "2GiB", nullptr, 4 * GiB).hbm_bytes, 2 * GiB);
  // host_bytes == 0 means unknown: no clamp.
  EXPECT_EQ(rt::make_config(nullptr, nullptr, "32GiB", nullptr, 0).hbm_bytes, 32 * GiB);
}

void expect_config_error(const rt::Config& c, const std::string& var, const std::string& value) {
  EXPECT_FALSE(c.error.empty());
  EXPECT_NE(c.error.find(var), std::string::npos) << c.error;
  EXPECT_NE(c.error.find("'" + value + "'"), std::string::npos) << c.error;
  EXPECT_TRUE(c.visible.empty()) << "an invalid config must expose no cores";
}

TEST(MakeConfig, ErrorsAreRecordedNotThrown) {
  expect_config_error(rt::make_config("0", nullptr, nullptr, nullptr, 0), "TORCH_NEURONX_SIM_CORES", "0");
  expect_config_error(rt::make_config("65", nullptr, nullptr, nullptr, 0), "TORCH_NEURONX_SIM_CORES", "65");
  expect_config_error(rt::make_config(nullptr, "2", nullptr, nullptr, 0), "NEURON_RT_VISIBLE_CORES", "2");
  expect_config_error(rt::make_config("4", "0,0", nullptr, nullptr, 0), "NEURON_RT_VISIBLE_CORES", "0,0");
  expect_config_error(rt::make_config(nullptr, nullptr, "lots", nullptr, 0), "TORCH_NEURONX_SIM_HBM", "lots");
  expect_config_error(rt::make_config(nullptr, nullptr, nullptr, "yes", 0), "NEURON_LAUNCH_BLOCKING", "yes");
  expect_config_error(rt::make_config(nullptr, nullptr, nullptr, "2", 0), "NEURON_LAUNCH_BLOCKING", "2");
}

TEST(MakeConfig, NeverThrowsOnMalformedNumbers) {
  rt::Config c;
  EXPECT_NO_THROW(c = rt::make_config(nullptr, nullptr, ".", nullptr, 0));
  expect_config_error(c, "TORCH_NEURONX_SIM_HBM", ".");
}

TEST(MakeConfig, VisibleCoresCheckedAgainstSimCores) {
  // 3 is valid with 4 simulated cores, invalid with the default 2.
  EXPECT_TRUE(rt::make_config("4", "3", nullptr, nullptr, 0).error.empty());
  EXPECT_FALSE(rt::make_config(nullptr, "3", nullptr, nullptr, 0).error.empty());
}

TEST(Config, HostPhysicalMemoryIsKnown) {
  EXPECT_GT(rt::host_physical_memory(), 64 * MiB);
}

TEST(Config, ProcessConfigMatchesEnvironmentDefaults) {
  const rt::Config& c = rt::config();
  EXPECT_EQ(&c, &rt::config()) << "parsed once";
  if (std::getenv("TORCH_NEURONX_SIM_CORES") || std::getenv("NEURON_RT_VISIBLE_CORES") ||
      std::getenv("TORCH_NEURONX_SIM_HBM"))
    GTEST_SKIP() << "device environment variables set";
  EXPECT_TRUE(c.error.empty()) << c.error;
  EXPECT_EQ(c.visible, (std::vector<int>{0, 1}));
  EXPECT_EQ(c.hbm_bytes, std::min(16 * GiB, rt::host_physical_memory()));
}

TEST(TaskError, Describe) {
  rt::TaskError e{"aten::index_select", "index 7 out of range", 0};
  EXPECT_EQ(e.describe(), "neuron kernel 'aten::index_select' failed: index 7 out of range");
  e.origin = 42;
  EXPECT_EQ(e.describe(), "neuron kernel 'aten::index_select' failed: index 7 out of range")
      << "no resolver: the token is not shown";
  rt::set_origin_hooks(nullptr, [](uint64_t t) { return "train.py:" + std::to_string(t); });
  EXPECT_EQ(e.describe(),
            "neuron kernel 'aten::index_select' failed: index 7 out of range (enqueued at train.py:42)");
  rt::set_origin_hooks(nullptr, nullptr);
}

}  // namespace

TEST(MakeConfig, AllocConf) {
  rt::Config c = rt::make_config(nullptr, nullptr, "8GiB", nullptr, 0,
                                 "per_process_memory_fraction:0.5, garbage_collection_threshold:0.8");
  ASSERT_TRUE(c.error.empty()) << c.error;
  EXPECT_DOUBLE_EQ(c.memory_fraction, 0.5);
  EXPECT_DOUBLE_EQ(c.gc_threshold, 0.8);
  for (const char* bad : {"per_process_memory_fraction:1.5", "garbage_collection_threshold:1",
                          "garbage_collection_threshold:x", "max_split_size_mb:64", "fraction"}) {
    rt::Config b = rt::make_config(nullptr, nullptr, nullptr, nullptr, 0, bad);
    EXPECT_NE(b.error.find("TORCH_NEURONX_ALLOC_CONF"), std::string::npos) << bad;
    EXPECT_TRUE(b.visible.empty()) << bad;
  }
  rt::Config u = rt::make_config(nullptr, nullptr, nullptr, nullptr, 0, "max_split_size_mb:64");
  EXPECT_NE(u.error.find("unknown key 'max_split_size_mb'"), std::string::npos) << u.error;
}
