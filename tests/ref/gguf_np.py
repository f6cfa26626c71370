"""gguf_np.py: a small, independent GGUF v3 reader for the numpy reference (testing layer 2).

Written from the format description (docs/gguf.md) only. Reads the header, every KV type (nested arrays included),
the tensor infos and the data section; returns KVs as a dict and tensors as numpy float32
arrays whose shape is the GGUF `ne` reversed (ne=[n_in, n_out] -> array (n_out, n_in)).
Block formats are dequantized by quant_np.dequantize(ggml_type, raw, n).

    g = GGUF("model.gguf")
    g.kv["general.architecture"]        # python value (int / float / bool / str / list / np array)
    g.kv_type["general.architecture"]   # GGUF value type id (8 = string)
    g.tensors["token_embd.weight"]      # TensorInfo(name, ne, ggml_type, offset, nbytes, data_offset)
    g.tensor("token_embd.weight")       # np.float32 array, shape ne reversed
    g.raw("token_embd.weight")          # the tensor's bytes

Every malformed input raises GGUFError naming the byte offset and the field.
"""

import mmap
import os
import struct

import numpy as np

from quant_np import dequantize as quant_dequantize

GGUF_MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32
MAX_DIMS = 4
MAX_NAME = 64

# GGUF KV value types
T_U8, T_I8, T_U16, T_I16, T_U32, T_I32, T_F32, T_BOOL, T_STR, T_ARR, T_U64, T_I64, T_F64 = range(13)
_SCALAR = {  # type -> (struct code, numpy dtype)
    T_U8: ("<B", "<u1"), T_I8: ("<b", "<i1"), T_U16: ("<H", "<u2"), T_I16: ("<h", "<i2"),
    T_U32: ("<I", "<u4"), T_I32: ("<i", "<i4"), T_F32: ("<f", "<f4"), T_BOOL: ("<B", "<u1"),
    T_U64: ("<Q", "<u8"), T_I64: ("<q", "<i8"), T_F64: ("<d", "<f8"),
}
INT_TYPES = (T_U8, T_I8, T_U16, T_I16, T_U32, T_I32, T_U64, T_I64)

# ggml tensor types: id -> (name, block elements, block bytes)
GGML_TYPES = {
    0: ("F32", 1, 4), 1: ("F16", 1, 2), 2: ("Q4_0", 32, 18), 3: ("Q4_1", 32, 20),
    6: ("Q5_0", 32, 22), 7: ("Q5_1", 32, 24), 8: ("Q8_0", 32, 34), 9: ("Q8_1", 32, 36),
    10: ("Q2_K", 256, 84), 11: ("Q3_K", 256, 110), 12: ("Q4_K", 256, 144),
    13: ("Q5_K", 256, 176), 14: ("Q6_K", 256, 210), 15: ("Q8_K", 256, 292),
    24: ("I8", 1, 1), 25: ("I16", 1, 2), 26: ("I32", 1, 4), 27: ("I64", 1, 8),
    28: ("F64", 1, 8), 30: ("BF16", 1, 2),
}


class GGUFError(ValueError):
    pass


class TensorInfo:
    __slots__ = ("name", "ne", "ggml_type", "offset", "nbytes", "data_offset", "info_offset")

    def __init__(self, name, ne, ggml_type, offset, nbytes, data_offset, info_offset):
        self.name = name              # str
        self.ne = ne                  # list of ints, ne[0] = row length
        self.ggml_type = ggml_type    # int
        self.offset = offset          # from the start of the data section
        self.nbytes = nbytes
        self.data_offset = data_offset  # absolute file offset
        self.info_offset = info_offset

    @property
    def shape(self):  # numpy order
        return tuple(reversed(self.ne))

    @property
    def n_elements(self):
        n = 1
        for d in self.ne:
            n *= d
        return n

    def __repr__(self):
        return "TensorInfo(%s, ne=%s, type=%s, offset=%d)" % (
            self.name, self.ne, GGML_TYPES.get(self.ggml_type, ("?",))[0], self.offset)


def dequantize(ggml_type, raw, n):
    """Bytes of n elements of ggml_type -> float32 array (n,)."""
    if ggml_type == 28:  # F64 (not a quant_np type)
        return np.frombuffer(raw, dtype="<f8", count=n).astype(np.float32)
    if ggml_type in (24, 25, 26, 27):
        dt = {24: "<i1", 25: "<i2", 26: "<i4", 27: "<i8"}[ggml_type]
        return np.frombuffer(raw, dtype=dt, count=n).astype(np.float32)
    if ggml_type not in (0, 1, 2, 8, 12, 14, 30):
        raise GGUFError("ggml type %s (%d) is not supported by the reference (quant_np)"
                        % (GGML_TYPES.get(ggml_type, ("?",))[0], ggml_type))
    return np.asarray(quant_dequantize(ggml_type, raw, n), dtype=np.float32)


class GGUF:
    """A parsed GGUF v3 file (read-only, memory-mapped)."""

    def __init__(self, path):
        self.path = path
        try:
            fd = open(path, "rb")
        except OSError as e:
            raise GGUFError("%s: cannot open: %s" % (path, e.strerror))
        with fd:
            self.size = os.fstat(fd.fileno()).st_size
            if self.size == 0:
                raise GGUFError("%s: empty file" % path)
            self._mm = mmap.mmap(fd.fileno(), 0, access=mmap.ACCESS_READ)
        self.buf = memoryview(self._mm)
        self.pos = 0
        self.kv = {}
        self.kv_type = {}
        self.tensors = {}
        self.tensor_order = []
        self._parse()

    # -- cursor ---------------------------------------------------------------------------------
    def _need(self, n, what):
        if n < 0 or self.pos + n > self.size:
            raise GGUFError("%s: truncated at byte %d reading %s (need %d bytes, file has %d)"
                            % (self.path, self.pos, what, n, self.size))

    def _scalar(self, t, what):
        code = _SCALAR[t][0]
        n = struct.calcsize(code)
        self._need(n, what)
        v = struct.unpack_from(code, self.buf, self.pos)[0]
        self.pos += n
        if t == T_BOOL:
            if v > 1:
                raise GGUFError("%s: bad bool value %d at byte %d (%s)" % (self.path, v, self.pos - 1, what))
            v = bool(v)
        return v

    def _u32(self, what):
        return self._scalar(T_U32, what)

    def _u64(self, what):
        return self._scalar(T_U64, what)

    def _string(self, what):
        at = self.pos
        n = self._u64(what + " length")
        if n > self.size - self.pos:
            raise GGUFError("%s: %s length %d at byte %d exceeds the file" % (self.path, what, n, at))
        s = bytes(self.buf[self.pos:self.pos + n])
        self.pos += n
        try:
            return s.decode("utf-8")
        except UnicodeDecodeError:
            raise GGUFError("%s: %s at byte %d is not valid UTF-8" % (self.path, what, at))

    def _value(self, t, what, depth=0):
        if t in _SCALAR:
            return self._scalar(t, what)
        if t == T_STR:
            return self._string(what)
        if t == T_ARR:
            if depth > 8:
                raise GGUFError("%s: arrays nested too deep at byte %d (%s)" % (self.path, self.pos, what))
            at = self.pos
            et = self._u32(what + " element type")
            n = self._u64(what + " element count")
            if et in _SCALAR:
                dt = np.dtype(_SCALAR[et][1])
                if n > (self.size - self.pos) // dt.itemsize:
                    raise GGUFError("%s: array %s of %d elements at byte %d exceeds the file"
                                    % (self.path, what, n, at))
                arr = np.frombuffer(self.buf, dtype=dt, count=n, offset=self.pos).copy()
                self.pos += n * dt.itemsize
                if et == T_BOOL:
                    if n and arr.max() > 1:
                        raise GGUFError("%s: bad bool in array %s at byte %d" % (self.path, what, at))
                    return [bool(x) for x in arr]
                return arr.tolist() if et in INT_TYPES else arr
            if et in (T_STR, T_ARR):
                if n > (self.size - self.pos) // (8 if et == T_STR else 12):
                    raise GGUFError("%s: array %s of %d elements at byte %d exceeds the file"
                                    % (self.path, what, n, at))
                return [self._value(et, "%s[%d]" % (what, i), depth + 1) for i in range(n)]
            raise GGUFError("%s: bad array element type %d at byte %d (%s)" % (self.path, et, at, what))
        raise GGUFError("%s: bad value type %d at byte %d (%s)" % (self.path, t, self.pos - 4, what))

    # -- file -----------------------------------------------------------------------------------
    def _parse(self):
        self._need(4, "magic")
        if bytes(self.buf[0:4]) != GGUF_MAGIC:
            raise GGUFError("%s: bad magic %r at byte 0 (expected b'GGUF')" % (self.path, bytes(self.buf[0:4])))
        self.pos = 4
        self.version = self._u32("version")
        if self.version != 3:
            raise GGUFError("%s: unsupported GGUF version %d at byte 4 (expected 3)" % (self.path, self.version))
        n_tensors = self._u64("n_tensors")
        n_kv = self._u64("n_kv")
        if n_tensors > self.size // 32 or n_kv > self.size // 12:
            raise GGUFError("%s: implausible counts n_tensors=%d n_kv=%d for a %d-byte file"
                            % (self.path, n_tensors, n_kv, self.size))
        for i in range(n_kv):
            at = self.pos
            key = self._string("key of kv %d" % i)
            t = self._u32("type of kv '%s'" % key)
            if key in self.kv:
                raise GGUFError("%s: duplicate key '%s' at byte %d" % (self.path, key, at))
            self.kv[key] = self._value(t, "kv '%s'" % key)
            self.kv_type[key] = t
        align = self.kv.get("general.alignment", DEFAULT_ALIGNMENT)
        if "general.alignment" in self.kv and self.kv_type["general.alignment"] not in INT_TYPES:
            raise GGUFError("%s: general.alignment has non-integer type %d" % (self.path, self.kv_type["general.alignment"]))
        if align <= 0 or (align & (align - 1)) != 0:
            raise GGUFError("%s: general.alignment %d is not a power of two" % (self.path, align))
        self.alignment = align
        infos = []
        for i in range(n_tensors):
            at = self.pos
            name = self._string("name of tensor %d" % i)
            if len(name.encode("utf-8")) > MAX_NAME:
                raise GGUFError("%s: tensor name '%s' at byte %d is longer than %d bytes" % (self.path, name, at, MAX_NAME))
            if name in self.tensors:
                raise GGUFError("%s: duplicate tensor '%s' at byte %d" % (self.path, name, at))
            n_dims = self._u32("n_dims of '%s'" % name)
            if n_dims < 1 or n_dims > MAX_DIMS:
                raise GGUFError("%s: tensor '%s' has n_dims %d at byte %d (1..%d)" % (self.path, name, n_dims, self.pos - 4, MAX_DIMS))
            ne = [self._u64("ne[%d] of '%s'" % (d, name)) for d in range(n_dims)]
            gt = self._u32("type of '%s'" % name)
            off = self._u64("offset of '%s'" % name)
            if gt not in GGML_TYPES:
                raise GGUFError("%s: tensor '%s' has unknown ggml type %d" % (self.path, name, gt))
            tname, blk, bsz = GGML_TYPES[gt]
            n = 1
            for d in ne:
                n *= d
            if n >= 1 << 62:
                raise GGUFError("%s: tensor '%s' has an impossible shape %s" % (self.path, name, ne))
            if ne[0] % blk != 0:
                raise GGUFError("%s: tensor '%s' ne[0]=%d is not a multiple of the %s block size %d"
                                % (self.path, name, ne[0], tname, blk))
            if off % align != 0:
                raise GGUFError("%s: tensor '%s' offset %d is not aligned to %d" % (self.path, name, off, align))
            nbytes = n // blk * bsz
            info = TensorInfo(name, ne, gt, off, nbytes, 0, at)
            infos.append(info)
            self.tensors[name] = info
            self.tensor_order.append(name)
        self.data_start = (self.pos + align - 1) // align * align
        if n_tensors and self.data_start > self.size:
            raise GGUFError("%s: data section at byte %d lies past the end of the file (%d)"
                            % (self.path, self.data_start, self.size))
        for info in infos:
            info.data_offset = self.data_start + info.offset
            if info.data_offset + info.nbytes > self.size:
                raise GGUFError("%s: tensor '%s' data [%d, %d) exceeds the file size %d"
                                % (self.path, info.name, info.data_offset, info.data_offset + info.nbytes, self.size))
        # overlapping tensors are a corrupt file
        spans = sorted((t.offset, t.offset + t.nbytes, t.name) for t in infos)
        for (a0, a1, an), (b0, b1, bn) in zip(spans, spans[1:]):
            if b0 < a1:
                raise GGUFError("%s: tensors '%s' and '%s' overlap in the data section" % (self.path, an, bn))

    # -- access ---------------------------------------------------------------------------------
    def raw(self, name):
        t = self._info(name)
        return self.buf[t.data_offset:t.data_offset + t.nbytes]

    def _info(self, name):
        t = self.tensors.get(name)
        if t is None:
            raise GGUFError("%s: no tensor '%s'" % (self.path, name))
        return t

    def tensor(self, name):
        """float32 array with the GGUF shape reversed (numpy order)."""
        t = self._info(name)
        arr = dequantize(t.ggml_type, self.raw(name), t.n_elements)
        if arr.shape != (t.n_elements,):
            raise GGUFError("%s: dequantize of '%s' returned %s elements, expected %d"
                            % (self.path, name, arr.shape, t.n_elements))
        return arr.reshape(t.shape)

    def has(self, name):
        return name in self.tensors

    def get(self, key, default=None):
        return self.kv.get(key, default)

    def close(self):
        self.buf.release()
        self._mm.close()


def read_gguf(path):
    """(kv dict, {name: float32 array}) for the whole file."""
    g = GGUF(path)
    return g.kv, {n: g.tensor(n) for n in g.tensor_order}


if __name__ == "__main__":  # python3 gguf_np.py FILE: dump the KVs and tensor infos
    import sys
    g = GGUF(sys.argv[1])
    print("version %d, %d kv, %d tensors, alignment %d, data at %d"
          % (g.version, len(g.kv), len(g.tensors), g.alignment, g.data_start))
    for k, v in g.kv.items():
        s = repr(v)
        print("  %-40s %s" % (k, s if len(s) < 100 else s[:97] + "..."))
    for n in g.tensor_order:
        print("  ", g.tensors[n])
