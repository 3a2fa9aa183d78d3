"""Print the Debian mirror apt's sources use for a release (`python3 apt_mirror.py bookworm`).

.ci/compose-e2e bootstraps its base image and fetches Compose from the mirror
this machine's apt already uses, read here at run time so that no mirror host
is ever written in the repository. Both source formats are read: deb822
(`/etc/apt/sources.list.d/*.sources`) and one-line (`sources.list`, `*.list`).
Exit status 1 when no `deb` source names the release.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

APT = Path("/etc/apt")


def _deb822(text: str) -> Iterator[tuple[list[str], list[str], list[str]]]:
    """(types, uris, suites) of each stanza of a .sources file."""
    for stanza in text.split("\n\n"):
        fields: dict[str, str] = {}
        for line in stanza.splitlines():
            if line.startswith("#") or ":" not in line or line[:1].isspace():
                continue
            key, _, value = line.partition(":")
            fields[key.strip().lower()] = value.strip()
        if fields.get("enabled", "yes").lower() == "no":
            continue
        yield (fields.get("types", "").split(), fields.get("uris", "").split(),
               fields.get("suites", "").split())  # fmt: skip


def _one_line(text: str) -> Iterator[tuple[list[str], list[str], list[str]]]:
    """(types, uris, suites) of each `deb [options] URI SUITE ...` line of a .list file."""
    for line in text.splitlines():
        words = line.split("#", 1)[0].split()
        if words and words[1:2] and words[1].startswith("["):
            while words[1:] and not words[1].endswith("]"):
                del words[1]
            del words[1]
        if len(words) >= 3:
            yield [words[0]], [words[1]], [words[2]]


def sources() -> Iterator[tuple[list[str], list[str], list[str]]]:
    """Every source entry apt reads, in apt's order."""
    main = APT / "sources.list"
    if main.is_file():
        yield from _one_line(main.read_text())
    for path in sorted((APT / "sources.list.d").glob("*")):
        if path.suffix == ".sources":
            yield from _deb822(path.read_text())
        elif path.suffix == ".list":
            yield from _one_line(path.read_text())


def mirror(release: str) -> str | None:
    """The first `deb` URI whose suites name `release` exactly."""
    for types, uris, suites in sources():
        if "deb" in types and release in suites and uris:
            return uris[0].rstrip("/")
    return None


if __name__ == "__main__":
    found = mirror(sys.argv[1])
    if found is None:
        sys.exit(f"no deb source of apt names the release {sys.argv[1]!r}")
    print(found)
