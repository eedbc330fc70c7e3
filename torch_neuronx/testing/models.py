"""Reference models and synthetic data shared by the examples, the benchmarks and the tests:
a nanoGPT, a BERT encoder, a ResNet-18, MLPs and a tiny transformer language model, built from
their arguments (no downloads), and seeded datasets for them."""
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import TensorDataset

__all__ = ["Block", "NanoGPT", "BertEncoder", "BasicBlock", "ResNet18", "mlp", "MLP", "TinyTransformerLM",
           "classification_data", "language_data", "TokenDataset"]


class Block(nn.Module):
    """nanoGPT decoder block (pre-norm, causal self-attention, GELU MLP)."""

    def __init__(self, d, heads):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc, self.out = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)
        self.heads = heads

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, d))
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class NanoGPT(nn.Module):
    def __init__(self, vocab=4096, d=256, layers=6, heads=8, seq=256):
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, d), nn.Embedding(seq, d)
        self.blocks = nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.ln, self.head = nn.LayerNorm(d), nn.Linear(d, vocab, bias=False)

    def forward(self, idx):
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
        for blk in self.blocks:
            x = blk(x)
        return self.head(self.ln(x))


class BertEncoder(nn.Module):
    def __init__(self, vocab=30522, d=768, layers=12, heads=12, ff=3072, seq=128):
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, d), nn.Embedding(seq, d)
        self.ln = nn.LayerNorm(d)
        layer = nn.TransformerEncoderLayer(d, heads, ff, dropout=0.0, activation="gelu", batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)

    def forward(self, idx):
        x = self.ln(self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device)))
        return self.encoder(x)


class BasicBlock(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.c1, self.b1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False), nn.BatchNorm2d(cout)
        self.c2, self.b2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False), nn.BatchNorm2d(cout)
        self.down = None
        if stride != 1 or cin != cout:
            self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        y = F.relu(self.b1(self.c1(x)))
        y = self.b2(self.c2(y))
        return F.relu(y + (x if self.down is None else self.down(x)))


class ResNet18(nn.Module):
    def __init__(self, classes=1000, width=64):
        super().__init__()
        w = width
        self.stem = nn.Sequential(nn.Conv2d(3, w, 7, 2, 3, bias=False), nn.BatchNorm2d(w), nn.ReLU(),
                                  nn.MaxPool2d(3, 2, 1))
        chans = [w, 2 * w, 4 * w, 8 * w]
        layers, cin = [], w
        for i, c in enumerate(chans):
            layers += [BasicBlock(cin, c, 1 if i == 0 else 2), BasicBlock(c, c, 1)]
            cin = c
        self.layers = nn.Sequential(*layers)
        self.fc = nn.Linear(cin, classes)

    def forward(self, x):
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(self.layers(self.stem(x)), 1), 1))


class SmallCNN(nn.Module):
    """Convolutions with batch norm, ReLU and max-pooling, then a linear classifier."""

    def __init__(self, widths=(32, 64, 128), classes=10):
        super().__init__()
        layers, cin = [], 3
        for cout in widths:
            layers += [nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(), nn.MaxPool2d(2)]
            cin = cout
        self.features = nn.Sequential(*layers)
        self.head = nn.Linear(cin, classes)

    def forward(self, x):
        return self.head(self.features(x).mean((2, 3)))


def mlp(d=1024, hidden=4096, classes=10):
    return nn.Sequential(nn.Linear(d, hidden), nn.GELU(), nn.Linear(hidden, hidden), nn.GELU(),
                         nn.Linear(hidden, classes))


class MLP(nn.Module):
    def __init__(self, d_in=64, hidden=256, classes=10):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(d_in, hidden), nn.GELU(), nn.Dropout(0.1),
                                 nn.Linear(hidden, hidden), nn.GELU(), nn.Linear(hidden, classes))

    def forward(self, x):
        return self.net(x)


class TinyTransformerLM(nn.Module):
    def __init__(self, vocab=128, d_model=64, heads=4, layers=2, seq=32):
        super().__init__()
        self.embed = nn.Embedding(vocab, d_model)
        self.pos = nn.Parameter(torch.randn(seq, d_model) * 0.02)
        layer = nn.TransformerEncoderLayer(d_model, heads, 4 * d_model, dropout=0.1, batch_first=True,
                                           norm_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(d_model, vocab)
        self.register_buffer("mask", nn.Transformer.generate_square_subsequent_mask(seq), persistent=False)

    def forward(self, tokens):
        h = self.embed(tokens) + self.pos[: tokens.shape[1]]
        h = self.encoder(h, mask=self.mask[: tokens.shape[1], : tokens.shape[1]], is_causal=True)
        return self.head(h)


def classification_data(n=2048, d_in=64, classes=10):
    g = torch.Generator().manual_seed(0)
    centers = torch.randn(classes, d_in, generator=g) * 2
    y = torch.randint(0, classes, (n,), generator=g)
    x = centers[y] + torch.randn(n, d_in, generator=g)
    return TensorDataset(x, y)


def language_data(n=512, seq=33, vocab=128):
    # Sequences of a noisy counting pattern: next token = (token + step) % vocab.
    g = torch.Generator().manual_seed(1)
    start = torch.randint(0, vocab, (n, 1), generator=g)
    step = torch.randint(1, 4, (n, 1), generator=g)
    seqs = (start + step * torch.arange(seq)) % vocab
    return TensorDataset(seqs[:, :-1], seqs[:, 1:])


class TokenDataset(torch.utils.data.Dataset):
    """``n`` token sequences of length ``seq`` from a vocabulary of ``vocab``, each from its own
    seed (so every process of a distributed job sees the same data), as Hugging Face's Trainer
    takes them: ``{"input_ids", "labels"}``."""

    def __init__(self, n=32, seq=16, vocab=128):
        self.n, self.seq, self.vocab = n, seq, vocab

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        ids = torch.randint(1, self.vocab, (self.seq,), generator=torch.Generator().manual_seed(i))
        return {"input_ids": ids, "labels": ids}
