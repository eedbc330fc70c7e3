"""Test assets for TorchTitan runs, generated offline: a byte-level BPE tokenizer trained with
`tokenizers` on generated text (with TorchTitan's expected tokenizer_config.json), and a JSON-lines
text data set in the layout of TorchTitan's `c4_test` (`load_dataset(path, split="train")`)."""
import json
import os
import random


def make_assets(out, documents=400, vocab=2000):
    """Writes `out`/tokenizer and `out`/data; returns (tokenizer dir, data dir)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    rng = random.Random(0)
    words = ["".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(2, 8))) for _ in range(400)]
    texts = [" ".join(rng.choice(words) for _ in range(rng.randint(40, 200))) for _ in range(documents)]
    tok_dir, data_dir = os.path.join(out, "tokenizer"), os.path.join(out, "data")
    os.makedirs(tok_dir, exist_ok=True)
    os.makedirs(data_dir, exist_ok=True)
    with open(os.path.join(data_dir, "train.json"), "w") as f:
        for t in texts:
            f.write(json.dumps({"text": t}) + "\n")
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    specials = ["<unk>", "<|begin_of_text|>", "<|end_of_text|>"]
    tok.train_from_iterator(texts, trainers.BpeTrainer(vocab_size=vocab, special_tokens=specials, show_progress=False))
    tok.save(os.path.join(tok_dir, "tokenizer.json"))
    with open(os.path.join(tok_dir, "tokenizer_config.json"), "w") as f:
        json.dump({"bos_token": specials[1], "eos_token": specials[2]}, f)
    return tok_dir, data_dir
