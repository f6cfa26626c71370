#!/usr/bin/python3
"""ref_cli.py: command-line entry to the numpy reference (model_np), called by the C tests.

Run with Debian's interpreter: /usr/bin/python3 tests/ref/ref_cli.py COMMAND [options]
Prints ONE JSON object on stdout; exit 0 on success, 1 on a bad file/token/runtime problem
(message on stderr: "ref_cli: error: ..."), 2 on a usage error.

Common options:
  --dtype f64|f32       compute precision (default f64)
  --rope auto|neox|norm target RoPE pairing (default auto: qwen3 neox, llama norm as llama.cpp)
  --kv f64|f16          target KV cache values: kept at --dtype (default), or rounded to float16 as
                        stored, like the default f16 cache of dflash and llama.cpp
  --top-k K             print the top K ids/values per logits row instead of the full rows
  --out PATH            also write the full array: PATH ending in .npy -> numpy .npy (float32),
                        anything else -> raw little-endian float32, row-major [n_rows, n_cols]
Every logits/features answer carries checksums: "sum", "sum_abs" (over the whole array, float64)
and "argmax" (per row).

Commands:
  logits   --model T.gguf --tokens 1,2,3 [--positions 0,1,2] [--split 2,1] [--all]
           Evaluate the tokens (in one batch, or in sequential batches of the --split sizes using
           the KV cache; positions default to 0..n-1). Rows: the last token, or every token with
           --all. JSON: n_vocab, n_rows, rows (token indices), logits [[...]] (or top_ids/top_vals).
  greedy   --model T.gguf --tokens 1,2,3 -n N
           Plain greedy decoding with the KV cache. JSON: {"tokens": [N generated ids]}.
  features --model T.gguf --tokens 1,2,3 --layers 1,3 [--positions ...]
           Layer inputs (id L = residual entering layer L, id n_layer = last layer's output before
           output_norm). Array [n_tokens, n_layers*n_embd], columns grouped per layer in --layers
           order. JSON: shape, sum, sum_abs (+ "features" lists when no --out).
  draft    --target T.gguf --drafter D.gguf --tokens 1,2,3 [--block B] [--last ID]
           Prefill the prompt in the target (positions 0..n-1), inject every prompt position's
           features into the drafter, then draft the block [last, MASK x (B-1)] at positions
           n..n+B-1. last defaults to the target's greedy token after the prompt. Rows: slots
           1..B-1. JSON: start, last, block_size, draft_tokens, logits (or top_ids/top_vals).
  spec     --target T.gguf --drafter D.gguf --tokens 1,2,3 -n N [--block B] [--check]
           Greedy speculative decoding (docs/drafter.md). JSON: tokens (N ids), accepted (per step,
           number a of accepted draft tokens, 0..B-1), tau (mean of a+1; null if no step), steps,
           drafts (per step the B-1 drafted ids). --check also runs target-alone greedy and adds
           "greedy_equal" (exit 1 when false).
"""

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np  # noqa: E402

import model_np as M  # noqa: E402
from gguf_np import GGUFError  # noqa: E402


class CliError(Exception):
    pass


def parse_ints(s, what):
    try:
        v = [int(x) for x in s.split(",") if x.strip() != ""]
    except ValueError:
        raise CliError("%s: '%s' is not a comma-separated list of integers" % (what, s))
    if not v:
        raise CliError("%s: empty list" % what)
    return v


def write_out(path, arr):
    a = np.ascontiguousarray(arr, dtype=np.float32)
    try:
        if path.endswith(".npy"):
            np.save(path, a)
        else:
            a.astype("<f4").tofile(path)
    except OSError as e:
        raise CliError("--out %s: %s" % (path, e.strerror))


def rows_json(arr, args, key):
    """Full rows (or top-k) plus checksums for a 2-D array."""
    j = {"sum": float(arr.sum()), "sum_abs": float(np.abs(arr).sum()),
         "argmax": np.argmax(arr, axis=-1).tolist()}
    if args.top_k:
        k = min(args.top_k, arr.shape[1])
        idx = np.argsort(-arr, axis=-1, kind="stable")[:, :k]
        j["top_ids"] = idx.tolist()
        j["top_vals"] = np.take_along_axis(arr, idx, axis=-1).tolist()
    else:
        j[key] = arr.tolist()
    if args.out:
        write_out(args.out, arr)
        j["out"] = args.out
    return j


def dtype_of(args):
    return np.float32 if args.dtype == "f32" else np.float64


def positions_of(args, n):
    if args.positions is None:
        return np.arange(n)
    p = parse_ints(args.positions, "--positions")
    if len(p) != n:
        raise CliError("--positions has %d entries for %d tokens" % (len(p), n))
    return np.array(p)


def load_target(path, args):
    return M.Target(path, dtype_of(args), None if args.rope == "auto" else args.rope, args.kv == "f16")


def cmd_logits(args):
    t = load_target(args.model, args)
    toks = parse_ints(args.tokens, "--tokens")
    pos = positions_of(args, len(toks))
    sizes = parse_ints(args.split, "--split") if args.split else [len(toks)]
    if sum(sizes) != len(toks) or min(sizes) <= 0:
        raise CliError("--split sizes %s do not add up to %d tokens" % (sizes, len(toks)))
    cache = t.new_cache()
    rows, a = [], 0
    for s in sizes:
        r = t.forward(toks[a:a + s], pos[a:a + s], cache, logits="all")
        rows.append(r.logits)
        a += s
    logits = np.concatenate(rows)                                  # (n_tokens, n_vocab)
    idx = list(range(len(toks))) if args.all else [len(toks) - 1]
    j = {"n_vocab": t.n_vocab, "n_rows": len(idx), "rows": idx}
    j.update(rows_json(logits[idx], args, "logits"))
    return j


def cmd_greedy(args):
    t = load_target(args.model, args)
    if args.n < 0:
        raise CliError("-n must be >= 0")
    return {"tokens": t.greedy(parse_ints(args.tokens, "--tokens"), args.n)}


def cmd_features(args):
    t = load_target(args.model, args)
    toks = parse_ints(args.tokens, "--tokens")
    layers = parse_ints(args.layers, "--layers")
    for L in layers:
        if not 0 <= L <= t.n_layer:
            raise CliError("--layers: id %d out of range [0, %d]" % (L, t.n_layer))
    r = t.forward(toks, positions_of(args, len(toks)), None, capture=layers, logits=None)
    f = np.concatenate([r.captured[L] for L in layers], axis=1)     # (n_tokens, n_layers*n_embd)
    j = {"layers": layers, "n_embd": t.n_embd, "shape": list(f.shape),
         "sum": float(f.sum()), "sum_abs": float(np.abs(f).sum())}
    if args.out:
        write_out(args.out, f)
        j["out"] = args.out
    else:
        j["features"] = f.tolist()
    return j


def load_pair(args):
    t = load_target(args.target, args)
    return t, M.Drafter(args.drafter, t, dtype_of(args))


def cmd_draft(args):
    t, d = load_pair(args)
    toks = parse_ints(args.tokens, "--tokens")
    n = len(toks)
    B = args.block or d.block_size
    r = t.forward(toks, np.arange(n), None, capture=d.target_layers, logits="last")
    dc = d.new_cache()
    d.add_context(dc, d.features(r.captured), np.arange(n))
    last = int(np.argmax(r.logits[-1])) if args.last is None else args.last
    if not 0 <= last < t.n_vocab:
        raise CliError("--last %d out of range [0, %d)" % (last, t.n_vocab))
    ids, logits = d.draft(dc, last, n, B)                          # (B-1,), (B-1, n_vocab)
    j = {"start": n, "last": last, "block_size": B, "mask_token_id": d.mask_token_id,
         "target_layers": d.target_layers, "draft_tokens": ids.tolist(), "n_vocab": logits.shape[1]}
    j.update(rows_json(logits, args, "logits"))
    return j


def cmd_spec(args):
    t, d = load_pair(args)
    toks = parse_ints(args.tokens, "--tokens")
    if args.n < 0:
        raise CliError("-n must be >= 0")
    B = args.block or d.block_size
    r = M.spec_generate(t, d, toks, args.n, B)
    j = {"tokens": r.tokens, "accepted": r.accepted, "tau": r.tau, "steps": len(r.accepted),
         "block_size": B, "drafts": r.drafts}
    if args.check:
        g = t.greedy(toks, args.n)
        j["greedy_equal"] = g == r.tokens
        if not j["greedy_equal"]:
            j["greedy_tokens"] = g
    return j


def main(argv):
    ap = argparse.ArgumentParser(prog="ref_cli.py", description="numpy reference of dflash (see the file header)")
    sub = ap.add_subparsers(dest="cmd")

    def common(p, pair=False):
        if pair:
            p.add_argument("--target", required=True)
            p.add_argument("--drafter", required=True)
        else:
            p.add_argument("--model", required=True)
        p.add_argument("--tokens", required=True)
        p.add_argument("--dtype", choices=("f64", "f32"), default="f64")
        p.add_argument("--rope", choices=("auto", "neox", "norm"), default="auto")
        p.add_argument("--kv", choices=("f64", "f16"), default="f64")
        p.add_argument("--top-k", type=int, default=0)
        p.add_argument("--out")
        return p

    p = common(sub.add_parser("logits"))
    p.add_argument("--positions")
    p.add_argument("--split")
    p.add_argument("--all", action="store_true")
    p = common(sub.add_parser("greedy"))
    p.add_argument("-n", type=int, required=True)
    p = common(sub.add_parser("features"))
    p.add_argument("--layers", required=True)
    p.add_argument("--positions")
    p = common(sub.add_parser("draft"), pair=True)
    p.add_argument("--block", type=int, default=0)
    p.add_argument("--last", type=int)
    p = common(sub.add_parser("spec"), pair=True)
    p.add_argument("-n", type=int, required=True)
    p.add_argument("--block", type=int, default=0)
    p.add_argument("--check", action="store_true")

    args = ap.parse_args(argv)
    if args.cmd is None:
        ap.print_usage(sys.stderr)
        sys.stderr.write("ref_cli.py: error: a command is required (logits, greedy, features, draft, spec)\n")
        return 2
    if args.top_k < 0:
        sys.stderr.write("ref_cli: error: --top-k must be >= 0\n")
        return 2
    fn = {"logits": cmd_logits, "greedy": cmd_greedy, "features": cmd_features,
          "draft": cmd_draft, "spec": cmd_spec}[args.cmd]
    try:
        j = fn(args)
    except (CliError, GGUFError, M.ModelError) as e:
        sys.stderr.write("ref_cli: error: %s\n" % e)
        return 1
    sys.stdout.write(json.dumps(j, separators=(",", ":")) + "\n")
    if j.get("greedy_equal") is False:
        sys.stderr.write("ref_cli: error: speculative output differs from target-alone greedy\n")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
