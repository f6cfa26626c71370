#!/usr/bin/python3
"""dequant_dump.py: dequantizes every tensor of a GGUF file with the numpy reference
(quant_np via gguf_np) and writes, in the file's tensor order, records of
  u32 name length, name bytes, u64 element count, float32[count] (little-endian)
to OUT. Used by tests/test_llama_quant.c to check dflash's dequantization bit for bit.

    /usr/bin/python3 tests/ref/dequant_dump.py MODEL.gguf OUT.bin
"""
import os
import struct
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gguf_np  # noqa: E402


def main():
    if len(sys.argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    g = gguf_np.GGUF(sys.argv[1])
    with open(sys.argv[2], "wb") as f:
        for name in g.tensor_order:
            arr = g.tensor(name).astype("<f4").reshape(-1)
            nb = name.encode("utf-8")
            f.write(struct.pack("<I", len(nb)))
            f.write(nb)
            f.write(struct.pack("<Q", arr.size))
            f.write(arr.tobytes())
    return 0


if __name__ == "__main__":
    sys.exit(main())
