#!/usr/bin/env python3
"""qwen_vocab_gguf.py TOKENIZER_JSON OUT.gguf - a vocabulary-only llama.cpp GGUF of a
Hugging Face Qwen2/Qwen3 tokenizer.json, written as llama.cpp's converter writes one
(conversion/base.py _set_vocab_gpt2): tokenizer.ggml.model "gpt2", pre "qwen2", the BPE
tokens by id in the byte-level spelling, then the added tokens, padded with [PAD<i>] to
151,936 ids; token types NORMAL (1), CONTROL (3) for special added tokens, USER_DEFINED (4)
for the others, UNUSED (5) for padding; merges "a b"; bos/eos/pad <|endoftext|>, no BOS
added.  No tensors: llama_peer loads it with vocab_only to tokenize.  Needs gguf-py
(tests/llama/get_gguf_py.sh; PYTHONPATH) and numpy."""
import json
import sys

import gguf

src, out = sys.argv[1], sys.argv[2]
tj = json.load(open(src, encoding="utf-8"))
vocab = tj["model"]["vocab"]
n_bpe = len(vocab)
tokens = [None] * n_bpe
for s, i in vocab.items():
    tokens[i] = s
types = [1] * n_bpe
for a in sorted(tj["added_tokens"], key=lambda a: a["id"]):
    assert a["id"] == len(tokens), "added tokens must follow the BPE ids"
    tokens.append(a["content"])
    looks_control = a["content"].startswith("<|") and a["content"].endswith("|>")
    types.append(3 if a["special"] or looks_control else 4)
n_pad = 151936 if len(tokens) <= 151936 else len(tokens)
while len(tokens) < n_pad:
    tokens.append("[PAD%d]" % len(tokens))
    types.append(5)
merges = [m if isinstance(m, str) else " ".join(m) for m in tj["model"]["merges"]]
eot = next(a["id"] for a in tj["added_tokens"] if a["content"] == "<|endoftext|>")

w = gguf.GGUFWriter(out, "qwen3")
w.add_tokenizer_model("gpt2")
w.add_tokenizer_pre("qwen2")
w.add_token_list(tokens)
w.add_token_types(types)
w.add_token_merges(merges)
w.add_bos_token_id(eot)
w.add_eos_token_id(eot)
w.add_pad_token_id(eot)
w.add_add_bos_token(False)
w.write_header_to_file()
w.write_kv_data_to_file()
w.write_tensors_to_file()
w.close()
