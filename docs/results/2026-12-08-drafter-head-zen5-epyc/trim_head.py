"""A drafter GGUF whose vocabulary (and so its tied lm head) keeps only the first N token ids: a timing
probe for what a trimmed head would save. Not a drafter for use: ids past N are not mapped."""
import sys
from pathlib import Path

import gguf
from gguf import GGUFReader, GGUFValueType, GGUFWriter

src, n, out = Path(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3])
r = GGUFReader(src)
arch = r.get_field("general.architecture").contents()
w = GGUFWriter(out, arch, endianess=r.endianess)
trim = {"tokenizer.ggml.tokens", "tokenizer.ggml.scores", "tokenizer.ggml.token_type"}
for f in r.fields.values():
    if f.name == gguf.Keys.General.ARCHITECTURE or f.name.startswith("GGUF."):
        continue
    vt = f.types[0]
    sub = f.types[-1] if vt == GGUFValueType.ARRAY else None
    val = f.contents()
    if f.name in trim:
        val = val[:n]
    w.add_key_value(f.name, val, vt, sub_type=sub)
tensors = [(t.name, t.data[:n] if t.name == "token_embd.weight" else t.data, t) for t in r.tensors]
for name, data, t in tensors:
    w.add_tensor_info(name, data.shape, data.dtype, data.nbytes, t.tensor_type)
w.write_header_to_file()
w.write_kv_data_to_file()
w.write_ti_data_to_file()
for _, data, _ in tensors:
    w.write_tensor_data(data, tensor_endianess=r.endianess)
w.close()
print(out, out.stat().st_size / 1e6, "MB")
