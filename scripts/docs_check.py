#!/usr/bin/env python3
"""The docs check: what the Markdown files and code comments point at exists.

    python3 scripts/docs_check.py

Reads every tracked Markdown file and checks that

- a repository path written in backticks (`orchestrator/src/cluster/`,
  `actors/dag/mod.rs`, `docs/python.md`) names a tracked file or folder,
  from the root or as the tail of a tracked path (module docs name files
  relative to their crate);
- a link to a local file resolves, and a `#anchor` into a Markdown file
  names one of its headings (GitHub's slugs);

in every tracked source file (.rs, .py, .pyi, .sh, .toml, .proto), that a
Markdown file named with an anchor in a comment or docstring, as
`docs/wire-format.md#1-conventions`, is tracked and has that heading
(paths from the root, the same slugs);

and, in every tracked source and documentation file, that nothing points
outside the repository: no design documents a reader cannot open, and no
issue numbers a reader cannot look up. Prints each finding as
`file:line: what` and exits 1 if there is any.
"""

import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# What a path in backticks may end with to be taken for a file.
EXTENSIONS = (".rs", ".py", ".pyi", ".md", ".toml", ".sh", ".proto", ".json", ".jsonl",
              ".args", ".yml", ".yaml", ".txt")
# Places that are made by running things, not tracked.
MADE = ("target/", ".bench/", ".venv/", "DIR/", "OUT/", "$")
# Pointers outside the repository, in any tracked text file.
OUTSIDE = [
    (re.compile(r"\bDESIGN(\.md| §)"), "names the design brief, which is not in the repository"),
    (re.compile(r"\bSTYLE\.md\b"), "names a style guide that is not in the repository"),
    (re.compile(r"\.\./shared/"), "points outside the repository"),
    (re.compile(r"\bissues? #?\d+\b", re.IGNORECASE), "cites an issue number a reader cannot look up"),
]
SOURCES = (".rs", ".py", ".pyi", ".md", ".sh", ".toml", ".proto", ".c", ".h")
# Source files whose comments may point at a heading of a Markdown file.
CODE = (".rs", ".py", ".pyi", ".sh", ".toml", ".proto")
SKIP = ("scripts/docs_check.py",)  # it names the patterns it looks for

TICKED = re.compile(r"`([^`\s]+)`")
LINK = re.compile(r"\]\(([^)\s]+)\)")
# `docs/NAME.md#anchor` in source text: the path from the root, then the slug.
ANCHORED = re.compile(r"(?<![\w./-])((?:[\w.-]+/)*[\w.-]+\.md)#([\w-]+)")


def tracked():
    out = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    files = [f for f in out.splitlines() if f]
    dirs = set()
    for f in files:
        p = f
        while "/" in p:
            p = p.rsplit("/", 1)[0]
            dirs.add(p)
    return files, dirs


def slug(heading):
    s = heading.strip().lower()
    s = re.sub(r"[^\w\- ]", "", s)
    return s.replace(" ", "-")


def anchors(path):
    out, fenced = set(), False
    with open(os.path.join(ROOT, path), encoding="utf-8") as f:
        for line in f:
            if line.startswith("```"):
                fenced = not fenced
            elif not fenced and line.startswith("#"):
                out.add(slug(line.lstrip("#")))
    return out


def looks_like_path(tok, tops):
    if tok.startswith(MADE) or tok.startswith(("-", "/", "~", ".", "http", "<")) or "*" in tok or "{" in tok:
        return False
    if "::" in tok or "=" in tok or "(" in tok or "@" in tok or "<" in tok:
        return False
    if tok.endswith(EXTENSIONS):
        return True
    return "/" in tok and tok.split("/", 1)[0] in tops


def main():
    files, dirs = tracked()
    fileset = set(files)
    tops = {d for d in dirs if "/" not in d}
    tails = set()
    for p in list(fileset) + list(dirs):
        parts = p.split("/")
        for i in range(1, len(parts)):
            tails.add("/".join(parts[i:]))

    def exists(tok):
        t = tok.rstrip("/").split(":", 1)[0]
        return t in fileset or t in dirs or t in tails

    found = []
    heads = {}

    def has_heading(doc, anchor):
        if doc not in heads:
            heads[doc] = anchors(doc)
        return anchor in heads[doc]
    for doc in (f for f in files if f.endswith(".md")):
        fenced = False
        with open(os.path.join(ROOT, doc), encoding="utf-8") as fh:
            for n, line in enumerate(fh, 1):
                if line.startswith("```"):
                    fenced = not fenced
                    continue
                if fenced:
                    continue
                for m in TICKED.finditer(line):
                    tok = m.group(1)
                    if looks_like_path(tok, tops) and not exists(tok):
                        found.append(f"{doc}:{n}: `{tok}` is no tracked file or folder")
                for m in LINK.finditer(line):
                    target = m.group(1)
                    if target.startswith(("http://", "https://", "mailto:")):
                        continue
                    path, _, anchor = target.partition("#")
                    dest = os.path.normpath(os.path.join(os.path.dirname(doc), path)) if path else doc
                    if dest not in fileset and dest not in dirs:
                        found.append(f"{doc}:{n}: link to {target}: {dest} is not tracked")
                    elif anchor and dest.endswith(".md") and not has_heading(dest, anchor):
                        found.append(f"{doc}:{n}: link to {target}: {dest} has no heading #{anchor}")
    for f in files:
        if not f.endswith(SOURCES) or f in SKIP or f.startswith(("wire/fuzz/corpus", "proto/fuzz/corpus")):
            continue
        try:
            text = open(os.path.join(ROOT, f), encoding="utf-8").read()
        except (UnicodeDecodeError, FileNotFoundError):
            continue
        for n, line in enumerate(text.splitlines(), 1):
            for pat, why in OUTSIDE:
                if pat.search(line):
                    found.append(f"{f}:{n}: {why}: {line.strip()[:100]}")
            if not f.endswith(CODE):
                continue
            for m in ANCHORED.finditer(line):
                doc, anchor = os.path.normpath(m.group(1)), m.group(2)
                if doc not in fileset:
                    found.append(f"{f}:{n}: {m.group(0)}: {doc} is not tracked")
                elif not has_heading(doc, anchor):
                    found.append(f"{f}:{n}: {m.group(0)}: {doc} has no heading #{anchor}")
    for x in found:
        print(x)
    if found:
        print(f"docs check: {len(found)} finding(s)", file=sys.stderr)
        return 1
    print(f"docs check: {sum(f.endswith('.md') for f in files)} Markdown files, "
          f"{sum(f.endswith(SOURCES) for f in files)} source files, nothing points nowhere", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
