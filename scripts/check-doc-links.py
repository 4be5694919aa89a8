#!/usr/bin/env python3
"""Checks the relative links of the repository's Markdown documents.

Every `[text](target)` outside code blocks and code spans in README.md, docs/**/*.md and
msg/WIRE.md (or the files named as arguments) whose target is not a URL must name a
file or folder that exists, and a `#fragment` must name a heading of that file, spelled
as GitHub spells heading anchors. Prints each broken link and exits 1 if there is any.

    python3 scripts/check-doc-links.py
"""
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LINK = re.compile(r"(?<!\!)\[(?:[^\[\]]|\[[^\]]*\])*\]\(([^)\s]+)\)")


def slug(heading):
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"`", "", heading.strip()).lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def prose_lines(path):
    """The file's lines outside fenced code blocks, with code spans blanked."""
    fence = None
    for number, line in enumerate(path.read_text().splitlines(), 1):
        stripped = line.lstrip()
        if fence is None and stripped.startswith(("```", "~~~")):
            fence = stripped[:3]
            continue
        if fence is not None:
            if stripped.startswith(fence):
                fence = None
            continue
        yield number, re.sub(r"`[^`]*`", "``", line)


def anchors(path):
    """The anchors of a file's headings (code spans' text included), outside code blocks."""
    seen = {}
    result = set()
    fence = None
    for line in path.read_text().splitlines():
        stripped = line.lstrip()
        if fence is None and stripped.startswith(("```", "~~~")):
            fence = stripped[:3]
            continue
        if fence is not None:
            if stripped.startswith(fence):
                fence = None
            continue
        match = re.match(r"#{1,6} (.*)", line)
        if match:
            base = slug(match.group(1))
            count = seen.get(base, 0)
            seen[base] = count + 1
            result.add(base if count == 0 else f"{base}-{count}")
    return result


def main(args):
    files = [Path(a).resolve() for a in args] or (
        [ROOT / "README.md", ROOT / "msg" / "WIRE.md"] + sorted((ROOT / "docs").rglob("*.md"))
    )
    broken = 0
    for path in files:
        for number, line in prose_lines(path):
            for target in LINK.findall(line):
                if re.match(r"[a-z][a-z0-9+.-]*:", target):
                    continue  # a URL
                file_part, _, fragment = target.partition("#")
                dest = (path.parent / file_part).resolve() if file_part else path
                where = f"{path.relative_to(ROOT)}:{number}: {target}"
                if not dest.exists():
                    print(f"{where}: no such file")
                    broken += 1
                elif fragment and dest.suffix == ".md" and fragment not in anchors(dest):
                    print(f"{where}: no heading with that anchor in {dest.relative_to(ROOT)}")
                    broken += 1
    checked = ", ".join(str(p.relative_to(ROOT)) for p in files)
    print(f"{broken} broken link(s) in {len(files)} file(s)" if broken else f"links ok: {checked}")
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
