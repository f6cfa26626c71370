"""export_gguf.py: writes the trained target (qwen3) and drafters (dflash: DFlash, DSpark, DFlash2) as GGUF v3 files.

    /usr/bin/python3 train/export_gguf.py --work train/work --out models

A small GGUF v3 writer (little-endian, alignment 32) with the keys and tensor names of docs/target.md and docs/drafter.md
sections 1-3. 2-D weights are F16, 1-D norms F32 (llama.cpp's convention). A torch Linear weight
(n_out, n_in) is written as-is: GGUF ne = [n_in, n_out]. The target's output head is tied to
token_embd (no output.weight); the drafter has no token_embd/output (it uses the target's).
DSpark (drafter-dspark.gguf) and DFlash2 (drafter-dflash2.gguf) add the tensors and keys of
llama.cpp's converter (conversion/qwen.py DSparkModel / DFlashModel; docs/drafter.md): names,
ggml shapes = torch shapes reversed (no transposes), F32 for 1-D tensors and for the conv bases
(names without .weight), F16 for the rest.
Both files carry the byte-level BPE tokenizer (gpt2 model, qwen2 pre-tokenizer, ChatML template,
<|MASK|> as tokenizer.ggml.mask_token_id).

round_to_export(model) rounds a torch model's weights exactly as the export stores them, so a
PyTorch evaluation of the rounded model is an evaluation of the committed GGUF weights.
"""

import argparse
import os
import struct
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bpe import Vocab  # noqa: E402
from model import Config, Target, make_drafter  # noqa: E402

ALIGN = 32
T_U8, T_I8, T_U16, T_I16, T_U32, T_I32, T_F32, T_BOOL, T_STR, T_ARR, T_U64, T_I64, T_F64 = range(13)
GGML_F32, GGML_F16 = 0, 1
FILE_TYPE_MOSTLY_F16 = 1

CHATML = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content']"
          " + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}"
          "{% endif %}")


class GGUFWriter:
    def __init__(self):
        self.kv = []        # (key, type, value, elem_type)
        self.tensors = []   # (name, np array (row-major, shape = ne reversed), ggml type)

    def add(self, key, vtype, value, elem_type=None):
        self.kv.append((key, vtype, value, elem_type))

    def add_tensor(self, name, arr, f32=False):
        arr = np.ascontiguousarray(arr)
        if arr.ndim >= 2 and not f32:
            self.tensors.append((name, arr.astype(np.float16), GGML_F16))
        else:
            self.tensors.append((name, arr.astype(np.float32), GGML_F32))

    @staticmethod
    def _str(s):
        b = s.encode("utf-8")
        return struct.pack("<Q", len(b)) + b

    def _val(self, t, v, et=None):
        fmt = {T_U8: "<B", T_I8: "<b", T_U16: "<H", T_I16: "<h", T_U32: "<I", T_I32: "<i", T_F32: "<f",
               T_BOOL: "<B", T_U64: "<Q", T_I64: "<q", T_F64: "<d"}
        if t == T_STR:
            return self._str(v)
        if t == T_ARR:
            out = struct.pack("<IQ", et, len(v))
            if et == T_STR:
                return out + b"".join(self._str(s) for s in v)
            return out + np.asarray(v, dtype=np.dtype(fmt[et][1:]).newbyteorder("<")).tobytes()
        return struct.pack(fmt[t], int(v) if t != T_F32 and t != T_F64 else v)

    def write(self, path):
        head = bytearray(b"GGUF")
        head += struct.pack("<IQQ", 3, len(self.tensors), len(self.kv))
        for key, t, v, et in self.kv:
            head += self._str(key) + struct.pack("<I", t) + self._val(t, v, et)
        offset = 0
        offsets = []
        for name, arr, gt in self.tensors:
            assert len(name) <= 64
            ne = list(reversed(arr.shape))
            head += self._str(name) + struct.pack("<I", len(ne)) + struct.pack("<%dQ" % len(ne), *ne)
            head += struct.pack("<IQ", gt, offset)
            offsets.append(offset)
            offset += arr.nbytes
            offset = (offset + ALIGN - 1) // ALIGN * ALIGN
        pad = (-len(head)) % ALIGN
        with open(path + ".tmp", "wb") as f:
            f.write(head + b"\0" * pad)
            pos = 0
            for (name, arr, gt), off in zip(self.tensors, offsets):
                f.write(b"\0" * (off - pos))
                b = arr.astype(arr.dtype.newbyteorder("<")).tobytes()
                f.write(b)
                pos = off + len(b)
            f.write(b"\0" * ((-pos) % ALIGN))
        os.replace(path + ".tmp", path)


def keeps_f32(name):
    """Parameters stored as F32 although >= 2-D: DFlash2's conv bases (llama.cpp's converter
    writes every tensor whose name does not end in .weight as F32)."""
    return name.endswith(".base")


def round_to_export(model):
    """Round every >= 2-D parameter to float16 (what the GGUF stores); 1-D stay float32."""
    with torch.no_grad():
        for n, p in model.named_parameters():
            if p.dim() >= 2 and not keeps_f32(n):
                p.copy_(p.half().float())
    return model


def add_hparams(w, arch, c):
    p = arch + "."
    w.add(p + "block_count", T_U32, c.n_layer)
    w.add(p + "context_length", T_U32, c.n_ctx)
    w.add(p + "embedding_length", T_U32, c.n_embd)
    w.add(p + "feed_forward_length", T_U32, c.n_ff)
    w.add(p + "attention.head_count", T_U32, c.n_head)
    w.add(p + "attention.head_count_kv", T_U32, c.n_head_kv)
    w.add(p + "attention.key_length", T_U32, c.head_dim)
    w.add(p + "attention.value_length", T_U32, c.head_dim)
    w.add(p + "attention.layer_norm_rms_epsilon", T_F32, c.eps)
    w.add(p + "rope.freq_base", T_F32, c.rope_base)


def add_tokenizer(w, v):
    sp = v.specials
    w.add("tokenizer.ggml.model", T_STR, "gpt2")
    w.add("tokenizer.ggml.pre", T_STR, "qwen2")
    w.add("tokenizer.ggml.tokens", T_ARR, v.tokens, T_STR)
    w.add("tokenizer.ggml.token_type", T_ARR, v.token_type, T_I32)
    w.add("tokenizer.ggml.merges", T_ARR, [a + " " + b for a, b in v.merges], T_STR)
    w.add("tokenizer.ggml.bos_token_id", T_U32, sp["<|endoftext|>"])
    w.add("tokenizer.ggml.eos_token_id", T_U32, sp["<|endoftext|>"])
    w.add("tokenizer.ggml.eot_token_id", T_U32, sp["<|im_end|>"])
    w.add("tokenizer.ggml.padding_token_id", T_U32, sp["<|endoftext|>"])
    w.add("tokenizer.ggml.mask_token_id", T_U32, sp["<|MASK|>"])
    w.add("tokenizer.ggml.add_bos_token", T_BOOL, False)
    w.add("tokenizer.chat_template", T_STR, CHATML)


def add_block(w, prefix, L):
    """One Qwen3 block's tensors (torch layout (n_out, n_in) = GGUF ne [n_in, n_out])."""
    t = lambda x: x.detach().float().numpy()  # noqa: E731
    w.add_tensor(prefix + "attn_norm.weight", t(L.attn_norm))       # [n_embd]
    w.add_tensor(prefix + "attn_q.weight", t(L.wq.weight))          # [n_embd, n_head*head_dim]
    w.add_tensor(prefix + "attn_k.weight", t(L.wk.weight))          # [n_embd, n_head_kv*head_dim]
    w.add_tensor(prefix + "attn_v.weight", t(L.wv.weight))          # [n_embd, n_head_kv*head_dim]
    w.add_tensor(prefix + "attn_output.weight", t(L.wo.weight))     # [n_head*head_dim, n_embd]
    w.add_tensor(prefix + "attn_q_norm.weight", t(L.q_norm))        # [head_dim]
    w.add_tensor(prefix + "attn_k_norm.weight", t(L.k_norm))        # [head_dim]
    w.add_tensor(prefix + "ffn_norm.weight", t(L.ffn_norm))         # [n_embd]
    w.add_tensor(prefix + "ffn_gate.weight", t(L.w_gate.weight))    # [n_embd, n_ff]
    w.add_tensor(prefix + "ffn_up.weight", t(L.w_up.weight))        # [n_embd, n_ff]
    w.add_tensor(prefix + "ffn_down.weight", t(L.w_down.weight))    # [n_ff, n_embd]


def export_target(model, v, path, name):
    c = model.c
    w = GGUFWriter()
    w.add("general.architecture", T_STR, "qwen3")
    w.add("general.name", T_STR, name)
    w.add("general.license", T_STR, "trained on public-domain text (KJV) and PSF-licensed code; see models/README.md")
    w.add("general.alignment", T_U32, ALIGN)
    w.add("general.file_type", T_U32, FILE_TYPE_MOSTLY_F16)
    add_hparams(w, "qwen3", c)
    add_tokenizer(w, v)
    w.add_tensor("token_embd.weight", model.tok_embd.weight.detach().numpy())   # [n_embd, n_vocab]
    w.add_tensor("output_norm.weight", model.output_norm.detach().numpy())      # [n_embd]
    for i, L in enumerate(model.layers):
        add_block(w, "blk.%d." % i, L)
    w.write(path)


def export_drafter(model, v, path, name):
    c = model.c
    w = GGUFWriter()
    w.add("general.architecture", T_STR, "dflash")
    w.add("general.name", T_STR, name)
    w.add("general.license", T_STR, "trained on public-domain text (KJV) and PSF-licensed code; see models/README.md")
    w.add("general.alignment", T_U32, ALIGN)
    w.add("general.file_type", T_U32, FILE_TYPE_MOSTLY_F16)
    add_hparams(w, "dflash", c)
    w.add("dflash.block_size", T_U32, c.block_size)
    w.add("dflash.target_layers", T_ARR, list(c.target_layers), T_I32)
    w.add("dflash.attention.causal", T_BOOL, False)
    fam = getattr(c, "family", "dflash")
    if fam == "dspark":
        # llama.cpp DSparkModel keys; absent sample_from_anchor means true there, so it is written
        w.add("dflash.sample_from_anchor", T_BOOL, bool(c.sample_from_anchor))
        w.add("dflash.has_confidence_head", T_BOOL, True)
    elif fam == "dflash2":
        w.add("dflash.conv_kernel_size", T_U32, c.conv_kernel_size)
        w.add("dflash.conv_group_size", T_U32, c.conv_group_size)
        w.add("dflash.selector_rank", T_U32, c.selector_rank)
        w.add("dflash.selector_top_k", T_U32, c.selector_top_k)
    add_tokenizer(w, v)
    t = lambda x: x.detach().float().numpy()  # noqa: E731
    w.add_tensor("fc.weight", t(model.fc.weight))                               # [n_tl*n_embd, n_embd]
    w.add_tensor("enc.output_norm.weight", t(model.enc_norm))                   # [n_embd]
    w.add_tensor("output_norm.weight", t(model.output_norm))                    # [n_embd]
    for i, L in enumerate(model.layers):
        add_block(w, "blk.%d." % i, L)
        if fam == "dflash2":
            for side, cv in (("attn", model.attn_conv[i]), ("ffn", model.ffn_conv[i])):
                w.add_tensor("blk.%d.%s_conv_base" % (i, side), t(cv.base), f32=True)     # [n_embd, K, 2] F32
                w.add_tensor("blk.%d.%s_conv_proj.weight" % (i, side), t(cv.proj.weight))  # [n_embd, 2*K*G]
    if fam == "dspark":
        w.add_tensor("markov_w1.weight", t(model.markov_w1.weight))             # [R, n_vocab] (rows per token)
        w.add_tensor("markov_w2.weight", t(model.markov_w2.weight))             # [R, n_vocab]
        w.add_tensor("conf_proj.weight", t(model.conf.weight))                  # [n_embd + R, 1]
        w.add_tensor("conf_proj.bias", t(model.conf.bias))                      # [1] F32
    elif fam == "dflash2":
        w.add_tensor("selector_predecessor.weight", t(model.sel_prev.weight))   # [R, n_vocab]
        w.add_tensor("selector_successor.weight", t(model.sel_next.weight))     # [R, n_vocab]
        w.add_tensor("selector_hidden.weight", t(model.sel_hidden.weight))      # [n_embd, R]
    w.write(path)


def load_target(path):
    ck = torch.load(path)
    m = Target(Config(**ck["config"]))
    m.load_state_dict(ck["model"])
    return m.eval()


def load_drafter(path, target):
    ck = torch.load(path)
    d = make_drafter(Config(**ck["config"]), target)
    d.load_state_dict(ck["model"])
    return d.eval()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--work", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--target-ckpt", default=None)
    ap.add_argument("--drafter-ckpt", default=None, help="the DFlash drafter's checkpoint (default work/drafter_final.pt)")
    ap.add_argument("--families", default="dflash,dspark,dflash2", help="drafters to export (those with a checkpoint)")
    ap.add_argument("--no-target", action="store_true", help="export the drafters only")
    a = ap.parse_args()
    v = Vocab.load(os.path.join(a.work, "vocab.json"))
    os.makedirs(a.out, exist_ok=True)
    t = round_to_export(load_target(a.target_ckpt or os.path.join(a.work, "target_final.pt")))
    assert t.c.n_vocab == len(v)
    tp = os.path.join(a.out, "target.gguf")
    if not a.no_target:
        export_target(t, v, tp, "dflash-default-target")
        print("export: %s (%.1f MB)" % (tp, os.path.getsize(tp) / 1e6))
    for fam, ck_name, out_name, name in (
            ("dflash", "drafter_final.pt", "drafter.gguf", "dflash-default-drafter"),
            ("dspark", "drafter_dspark_final.pt", "drafter-dspark.gguf", "dflash-default-drafter-dspark"),
            ("dflash2", "drafter_dflash2_final.pt", "drafter-dflash2.gguf", "dflash-default-drafter-dflash2")):
        dpath = (a.drafter_ckpt if fam == "dflash" else None) or os.path.join(a.work, ck_name)
        if fam not in a.families.split(",") or not os.path.exists(dpath):
            continue
        d = round_to_export(load_drafter(dpath, t))
        assert d.c.family == fam
        dp = os.path.join(a.out, out_name)
        export_drafter(d, v, dp, name)
        print("export: %s (%.1f MB)" % (dp, os.path.getsize(dp) / 1e6))


if __name__ == "__main__":
    main()
