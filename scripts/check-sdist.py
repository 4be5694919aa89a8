#!/usr/bin/env python3
"""Checks a source distribution of the Python package (maturin sdist) before release:
that it holds what a build from it needs (the pyproject, the extension crate with its
lock file, the Python sources, every Rust crate it builds from) and nothing that does
not belong in it (build output, version control, the repository's tests, benchmarks
and docs), and that its metadata carries the readme and the license.

Usage: scripts/check-sdist.py dist/switchyard-X.Y.Z.tar.gz
"""

import sys
import tarfile

# What a build from the sdist needs, relative to its top folder.
REQUIRED = [
    "PKG-INFO",
    "pyproject.toml",
    "python/Cargo.toml",
    "python/Cargo.lock",
    "python/src/lib.rs",
    "switchyard/__init__.py",
    "switchyard/torch.py",
    "Cargo.toml",
    "src/lib.rs",
    "msg/src/lib.rs",
    "transports/src/lib.rs",
    "stub/src/lib.rs",
    "net/src/lib.rs",
    "link/src/lib.rs",
    "bootstrap/src/lib.rs",
    "secret/src/lib.rs",
    "tracker/src/lib.rs",
    "ps/src/lib.rs",
]
# Folders that must not appear anywhere in it.
FORBIDDEN_PARTS = {"target", ".git", "fuzz", "cli", "launch", "mpirun", "examples", "scripts", "docs", ".ci"}
MAX_FILE_BYTES = 512 * 1024
MAX_TOTAL_BYTES = 8 * 1024 * 1024


def main(path):
    problems = []
    with tarfile.open(path) as sdist:
        members = [m for m in sdist.getmembers() if m.isfile()]
        names = {}
        for m in members:
            top, _, rest = m.name.partition("/")
            names[rest] = m
        for need in REQUIRED:
            if need not in names:
                problems.append(f"missing {need}")
        for rest, m in names.items():
            parts = rest.split("/")
            if FORBIDDEN_PARTS.intersection(parts[:-1]):
                problems.append(f"does not belong: {rest}")
            if m.size > MAX_FILE_BYTES:
                problems.append(f"{rest}: {m.size} bytes (at most {MAX_FILE_BYTES})")
        total = sum(m.size for m in members)
        if total > MAX_TOTAL_BYTES:
            problems.append(f"{total} bytes in all (at most {MAX_TOTAL_BYTES})")
        info = sdist.extractfile(names["PKG-INFO"]).read().decode() if "PKG-INFO" in names else ""
        for field in ("License: MIT OR Apache-2.0", "Description-Content-Type: text/markdown"):
            if field not in info:
                problems.append(f"PKG-INFO lacks '{field}'")
    if problems:
        print(f"{path}:", *problems, sep="\n  ", file=sys.stderr)
        return 1
    print(f"{path}: {len(members)} files, {total} bytes")
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    sys.exit(main(sys.argv[1]))
