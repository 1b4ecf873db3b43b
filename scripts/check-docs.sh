#!/usr/bin/env bash
# Checks the documentation: builds the user guide (docs/guide, an mdBook) and checks that every
# relative Markdown link in README.md, docs/*.md and docs/guide/src/*.md resolves to a file
# that exists and, with a #fragment, to a heading of that file (anchors computed as GitHub
# computes them). Also checks that every guide page is listed in docs/guide/src/SUMMARY.md and
# that every {{#include}} in the guide names a file that exists. Needs bash and python3; no
# network, except to install mdbook (pinned) with cargo when it is missing. `.ci/run` runs it
# after clippy.
#
#   scripts/check-docs.sh               # build the book, then check the links
#   scripts/check-docs.sh --links-only  # check the links only (no mdbook)
set -euo pipefail
cd "$(dirname "$0")/.."

MDBOOK_VERSION=0.5.4

if [ "${1:-}" != "--links-only" ]; then
  mdbook="$(command -v mdbook || true)"
  if [ -z "$mdbook" ] && [ -x "${CARGO_HOME:-$HOME/.cargo}/bin/mdbook" ]; then
    mdbook="${CARGO_HOME:-$HOME/.cargo}/bin/mdbook"
  fi
  if [ -z "$mdbook" ]; then
    echo "check-docs: installing mdbook $MDBOOK_VERSION (cargo install)" >&2
    # Without the default `serve` and `watch` features: the build needs neither.
    cargo install mdbook --locked --version "$MDBOOK_VERSION" \
      --no-default-features --features search
    mdbook="$(command -v mdbook || echo "${CARGO_HOME:-$HOME/.cargo}/bin/mdbook")"
  fi
  "$mdbook" build docs/guide
fi

python3 - <<'PY'
import glob
import os
import re
import sys
import unicodedata

FILES = sorted(["README.md"] + glob.glob("docs/*.md") + glob.glob("docs/guide/src/*.md"))
GUIDE = "docs/guide/src"

FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")
ATX = re.compile(r"^ {0,3}(#{1,6})(?:[ \t]+(.*?))?[ \t]*#*[ \t]*$")
SETEXT = re.compile(r"^ {0,3}(=+|-+)[ \t]*$")
HTML_ID = re.compile(r"""<[a-zA-Z][^>]*\s(?:id|name)\s*=\s*["']([^"']+)["']""")
CODE_SPAN = re.compile(r"(`+)(.+?)\1")
# [text](target) and ![alt](target); the target may be <...> and may carry a "title".
INLINE_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*(<[^>]*>|[^\s()]*(?:\([^\s()]*\)[^\s()]*)*)(?:\s+(?:\"[^\"]*\"|'[^']*'))?\s*\)")
REF_DEF = re.compile(r"^ {0,3}\[[^\]]+\]:\s*(\S+)")
INCLUDE = re.compile(r"\{\{#include\s+([^}\s]+)\s*\}\}")
SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")


def lines_outside_code(path):
    """(line number, text) of every line outside fenced code blocks, inline code blanked."""
    out = []
    fence = None
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            line = line.rstrip("\n")
            m = FENCE.match(line)
            if fence is None and m:
                fence = m.group(1)[0] * len(m.group(1))
                continue
            if fence is not None:
                if line.strip().startswith(fence) and set(line.strip()) == {fence[0]}:
                    fence = None
                continue
            out.append((number, line))
    return out


def heading_text(raw):
    """A heading's text as rendered: inline code, links and emphasis reduced to their text."""
    text = CODE_SPAN.sub(lambda m: m.group(2).strip(), raw)
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", text)
    text = re.sub(r"<[^>]+>", "", text)
    text = re.sub(r"(\*+)(.+?)\1", r"\2", text)
    return text.strip()


def slug(text):
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = text.lower()
    kept = []
    for ch in text:
        cat = unicodedata.category(ch)
        if ch in "-_" or cat[0] in "LN" or cat == "Mn":
            kept.append(ch)
        elif ch == " ":
            kept.append("-")
    return "".join(kept)


_anchors = {}


def anchors(path):
    if path in _anchors:
        return _anchors[path]
    found = set()
    counts = {}
    previous = None
    for _number, line in lines_outside_code(path):
        text = None
        m = ATX.match(line)
        if m:
            text = m.group(2) or ""
        elif previous is not None and previous.strip() and SETEXT.match(line) \
                and not ATX.match(previous) and not previous.lstrip().startswith(("-", "*", "|", ">")):
            text = previous
        if text is not None:
            base = slug(heading_text(text))
            n = counts.get(base, 0)
            counts[base] = n + 1
            found.add(base if n == 0 else f"{base}-{n}")
        for m in HTML_ID.finditer(line):
            found.add(m.group(1))
        previous = line
    _anchors[path] = found
    return found


problems = []


def check_target(path, number, target):
    if target.startswith("<") and target.endswith(">"):
        target = target[1:-1]
    if not target or SCHEME.match(target) or target.startswith("//"):
        return
    file_part, _, fragment = target.partition("#")
    file_part = file_part.split("?", 1)[0]
    if file_part:
        if file_part.startswith("/"):
            problems.append(f"{path}:{number}: link '{target}' is absolute; use a relative path")
            return
        resolved = os.path.normpath(os.path.join(os.path.dirname(path), file_part))
    else:
        resolved = path
    if not os.path.exists(resolved):
        problems.append(f"{path}:{number}: link '{target}': no file {resolved}")
        return
    if fragment and resolved.endswith(".md"):
        if fragment not in anchors(resolved):
            problems.append(
                f"{path}:{number}: link '{target}': no heading with anchor #{fragment} in {resolved}"
            )


for path in FILES:
    for number, line in lines_outside_code(path):
        visible = CODE_SPAN.sub(lambda m: " " * len(m.group(0)), line)
        for m in INLINE_LINK.finditer(visible):
            check_target(path, number, m.group(1))
        m = REF_DEF.match(visible)
        if m:
            check_target(path, number, m.group(1))
        if path.startswith(GUIDE + "/"):
            for m in INCLUDE.finditer(line):
                included = m.group(1).split(":", 1)[0]
                resolved = os.path.normpath(os.path.join(os.path.dirname(path), included))
                if not os.path.isfile(resolved):
                    problems.append(f"{path}:{number}: include '{m.group(1)}': no file {resolved}")

# Every page of the guide is reachable from its table of contents.
summary = os.path.join(GUIDE, "SUMMARY.md")
listed = set()
for number, line in lines_outside_code(summary):
    for m in INLINE_LINK.finditer(line):
        listed.add(os.path.normpath(os.path.join(GUIDE, m.group(1).split("#")[0])))
for page in sorted(glob.glob(os.path.join(GUIDE, "*.md"))):
    if page != summary and os.path.normpath(page) not in listed:
        problems.append(f"{page}:1: page not listed in {summary}")

if problems:
    print("check-docs: broken documentation links:", file=sys.stderr)
    for problem in problems:
        print("  " + problem, file=sys.stderr)
    print(f"check-docs: {len(problems)} problem(s) in {len(FILES)} files", file=sys.stderr)
    sys.exit(1)
print(f"check-docs: every relative link in {len(FILES)} files resolves")
PY
