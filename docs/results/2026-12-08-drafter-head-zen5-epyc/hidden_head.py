"""Can a drafter compute its own head? llama.cpp with embeddings on (no pooling) hands out the last position's
hidden state; the tied head's rows, dequantized, times it should give llama.cpp's own logits."""
from pathlib import Path

import llama_cpp
import numpy as np
from gguf import GGUFReader
from gguf.quants import dequantize

path = Path.home() / ".cache/splitspec/gemma-3-270m-q4_k_m.gguf"
emb = next(t for t in GGUFReader(path).tensors if t.name == "token_embd.weight")
llm = llama_cpp.Llama(str(path), n_ctx=256, n_threads=1, embedding=True, pooling_type=llama_cpp.LLAMA_POOLING_TYPE_NONE,
                      verbose=False)
prompt = llm.tokenize(b"Write a short story about a lighthouse keeper who finds a message in a bottle.")
llm.eval(prompt)
h = np.ctypeslib.as_array(llama_cpp.llama_get_embeddings_ith(llm.ctx, -1), shape=(640,)).copy()
logits = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(llm.ctx, -1), shape=(llm.n_vocab(),)).copy()
rows = np.arange(0, llm.n_vocab(), 7)  # a seventh of the rows, dequantized
head = dequantize(np.asarray(emb.data[rows]), emb.tensor_type)
mine = head @ h
print(f"hidden state |h| {np.linalg.norm(h):.2f}; llama.cpp's logits over {len(rows)} rows: max |diff| against "
      f"dequantized rows x h {np.abs(mine - logits[rows]).max():.4f} (logit spread {logits.std():.2f}); "
      f"argmax over all rows: llama.cpp {int(logits.argmax())}")
