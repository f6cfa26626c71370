"""corpus.py: builds the training corpus of the embedded default pair from Debian packages.

Sources (see models/README.md for licenses):
  prose: the King James Bible from bible-kjv (`bible -f "Genesis 1:1-Revelation 22:21"`), one
         document per chapter, one verse per line, the verse references stripped.
  code:  the Python 3.11 standard library sources under /usr/lib/python3.11 (libpython3.11-stdlib),
         one document per file; without test suites, idlelib, the codec tables (encodings/),
         generated data modules and files over 200 kB.
Split (deterministic): every 30th Bible chapter (index % 30 == 15) and every code file whose
crc32(relative path) % 20 == 7 are held out; the models never see them in training.

    python3 train/corpus.py --out train/work
writes train_prose.txt, train_code.txt, heldout_prose.txt, heldout_code.txt (documents joined
by <|endoftext|>) and corpus_stats.json.
"""

import argparse
import json
import os
import re
import subprocess
import zlib

EOT = "<|endoftext|>"
STDLIB = "/usr/lib/python3.11"
SKIP_DIRS = {"test", "tests", "idlelib", "encodings", "__pycache__", "dist-packages",
             "site-packages", "lib-dynload", "__phello__"}
SKIP_FILES = re.compile(r"^(_sysconfigdata.*|__hello__|_pydecimal|topics)\.py$")
MAX_FILE = 200_000
VERSE = re.compile(r"^([1-3]?[A-Za-z]+)(\d+):(\d+) (.*)$")


def bible_chapters():
    """-> list of (ref "Ge1", text) per chapter, verses one per line."""
    out = subprocess.run(["bible", "-f", "Genesis 1:1-Revelation 22:21"], check=True,
                         capture_output=True, text=True).stdout
    chapters, cur, verses = [], None, []
    for line in out.splitlines():
        if not line.strip():
            continue
        m = VERSE.match(line)
        if not m:
            raise SystemExit("corpus: unexpected bible line %r" % line[:80])
        ref = m.group(1) + m.group(2)
        if ref != cur:
            if verses:
                chapters.append((cur, "\n".join(verses) + "\n"))
            cur, verses = ref, []
        verses.append(m.group(4).strip())
    if verses:
        chapters.append((cur, "\n".join(verses) + "\n"))
    return chapters


def stdlib_files():
    """-> sorted list of (relative path, text)."""
    files = []
    for root, dirs, names in os.walk(STDLIB):
        rel_root = os.path.relpath(root, STDLIB)
        dirs[:] = sorted(d for d in dirs if d not in SKIP_DIRS and not d.startswith("config-"))
        for n in sorted(names):
            if not n.endswith(".py") or SKIP_FILES.match(n):
                continue
            p = os.path.join(root, n)
            if os.path.getsize(p) > MAX_FILE or os.path.islink(p):
                continue
            with open(p, encoding="utf-8", errors="strict") as f:
                text = f.read()
            if text.strip():
                files.append((os.path.normpath(os.path.join(rel_root, n)), text))
    return sorted(files)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    chapters = bible_chapters()
    files = stdlib_files()
    tr_prose, tr_code, ho_prose, ho_code = [], [], [], []
    for i, (ref, text) in enumerate(chapters):
        (ho_prose if i % 30 == 15 else tr_prose).append(text)
    for path, text in files:
        (ho_code if zlib.crc32(path.encode()) % 20 == 7 else tr_code).append(text)
    train = tr_prose + tr_code
    for name, docs in (("train_prose.txt", tr_prose), ("train_code.txt", tr_code),
                       ("heldout_prose.txt", ho_prose), ("heldout_code.txt", ho_code)):
        with open(os.path.join(a.out, name), "w", encoding="utf-8") as f:
            f.write(EOT.join(docs))
    stats = {
        "bible_chapters": len(chapters), "bible_chars": sum(len(t) for _, t in chapters),
        "heldout_chapters": [ref for i, (ref, _) in enumerate(chapters) if i % 30 == 15],
        "stdlib_files": len(files), "stdlib_chars": sum(len(t) for _, t in files),
        "heldout_files": [p for p, _ in files if zlib.crc32(p.encode()) % 20 == 7],
        "train_docs": len(train), "train_chars": sum(len(t) for t in train),
        "heldout_prose_chars": sum(len(t) for t in ho_prose),
        "heldout_code_chars": sum(len(t) for t in ho_code),
    }
    with open(os.path.join(a.out, "corpus_stats.json"), "w") as f:
        json.dump(stats, f, indent=1)
    print("corpus: %d chapters (%d held out), %d files (%d held out), train %.1f MB" % (
        len(chapters), len(ho_prose), len(files), len(ho_code), stats["train_chars"] / 1e6))


if __name__ == "__main__":
    main()
