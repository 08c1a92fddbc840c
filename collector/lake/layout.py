"""Where the lake is and how staged files are named; no pyiceberg here (the sidecar imports it).

A lake is a pyarrow.fs location: a local path, `file:///path`, or any URI pyarrow.fs opens
(`s3://bucket/prefix`, `gs://...`, `abfs://...`). Under it:

    staged/<writer>/<writer>-<seq>.parquet   immutable files the sidecars write (one UTC day each)
    warehouse/                               the Iceberg table's metadata and compacted data

`<writer>` is the sidecar's instance name and a random epoch persisted beside its spool (so a
pod that reuses a name with an empty spool never rewrites another's files); `<seq>` is a
persisted sequence number, 12 digits, so names sort in the order they were written.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.fs as pafs

__all__ = [
    "Lake",
    "StagedName",
    "STAGED",
    "WAREHOUSE",
    "staged_name",
    "parse_staged",
    "read_removed_mark",
    "write_removed_mark",
    "safe_writer_part",
    "private_files",
    "check_lake_uri",
]

STAGED, WAREHOUSE = "staged", "warehouse"
_STAGED_RE = re.compile(r"^(?P<writer>[A-Za-z0-9._-]+)-(?P<seq>\d{12})\.parquet$")
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


@dataclass(frozen=True)
class StagedName:
    """A staged file: its full path in the lake's filesystem, writer and sequence number."""

    path: str
    writer: str
    seq: int


@dataclass(frozen=True)
class Lake:
    """A lake location: its pyarrow filesystem, the base path in it, and its URI for Iceberg."""

    uri: str  # as given, normalised: file:///abs/path for a local path
    fs: pafs.FileSystem
    base: str  # the base path inside fs (no trailing slash)

    @classmethod
    def parse(cls, uri: str | os.PathLike[str]) -> Lake:
        """`/data/lake`, `file:///data/lake` or `s3://bucket/prefix` -> a Lake; ValueError otherwise.

        Example: Lake.parse("lake") -> Lake(uri="file:///current/dir/lake", base="/current/dir/lake").
        """
        text = os.fspath(uri).strip()
        if not text:
            raise ValueError("--lake is empty; give a directory or a URI such as s3://bucket/prefix")
        if "://" not in text:
            local = os.path.abspath(text)
            return cls(uri=_file_uri(local), fs=pafs.LocalFileSystem(), base=local.rstrip("/") or "/")
        try:
            fs, base = pafs.FileSystem.from_uri(text)
        except pa.ArrowInvalid as exc:
            raise ValueError(_malformed(uri, exc)) from None
        except (OSError, ValueError) as exc:  # well formed, but its store did not answer
            raise ValueError(f"--lake {uri!r}: cannot reach its store now ({exc})") from None
        scheme = text.split("://", 1)[0]
        base = base.rstrip("/")
        if isinstance(fs, pafs.LocalFileSystem):
            return cls(uri=_file_uri(base), fs=fs, base=base)
        return cls(uri=f"{scheme}://{base}", fs=fs, base=base)

    @property
    def local(self) -> bool:
        """True for a local filesystem (writes go to a temporary name, then a rename)."""
        return isinstance(self.fs, pafs.LocalFileSystem)

    def path(self, *parts: str) -> str:
        """A path inside the lake's filesystem, e.g. lake.path("staged", "w-1") -> "/data/lake/staged/w-1"."""
        return "/".join([self.base, *parts])

    def uri_of(self, path: str) -> str:
        """The URI Iceberg records for a path of this filesystem (file:///... or s3://...)."""
        if self.local:
            return _file_uri(path)
        scheme = self.uri.split("://", 1)[0]
        return f"{scheme}://{path}"

    def path_of(self, uri: str) -> str:
        """The inverse of uri_of: a file:// or s3:// URI -> the path inside fs."""
        if self.local:
            return uri[len("file://") :] if uri.startswith("file://") else uri
        return uri.split("://", 1)[1] if "://" in uri else uri

    @property
    def warehouse(self) -> str:
        """The Iceberg warehouse URI (where the table's metadata and compacted files go)."""
        return f"{self.uri.rstrip('/')}/{WAREHOUSE}"

    def staged(self) -> list[StagedName]:
        """Every staged file, sorted by writer then sequence; temporary and foreign names are skipped."""
        selector = pafs.FileSelector(self.path(STAGED), allow_not_found=True, recursive=True)
        found = []
        for info in self.fs.get_file_info(selector):
            if info.type != pafs.FileType.File:
                continue
            parsed = parse_staged(info.path)
            if parsed is not None:
                found.append(parsed)
        return sorted(found, key=lambda name: (name.writer, name.seq))


def _malformed(uri: str | os.PathLike[str], exc: BaseException) -> str:
    return (
        f"--lake {os.fspath(uri)!r} is not a location pyarrow.fs can open ({exc}); "
        "e.g. /data/lake, file:///data/lake or s3://bucket/prefix"
    )


def check_lake_uri(uri: str | os.PathLike[str]) -> str:
    """The URI as Lake.parse would give it, checked without asking the network; ValueError when
    no store could ever serve it (an unknown scheme, no bucket, an unknown option).

    Example: check_lake_uri("s3://bucket/x") -> "s3://bucket/x" with no network up or down.
    """
    text = os.fspath(uri).strip()
    if "://" not in text or text.startswith("file://"):
        return Lake.parse(text).uri
    probe = text
    if text.startswith("s3://") and "region=" not in text:  # else pyarrow asks S3 for the region
        probe += ("&" if "?" in text else "?") + "region=us-east-1"
    try:
        pafs.FileSystem.from_uri(probe)
    except pa.ArrowInvalid as exc:
        raise ValueError(_malformed(uri, exc)) from None
    except (OSError, ValueError):
        pass  # well formed; whether its store answers is the writer's to retry
    return text


def _file_uri(path: str) -> str:
    """`/a/day=1` -> `file:///a/day=1`: not percent-encoded, as pyiceberg's FileIO reads it back."""
    return "file://" + path


def safe_writer_part(text: str) -> str:
    """An instance name made safe for a file name: `pod/7 a` -> `pod_7_a` (never empty)."""
    return _UNSAFE.sub("_", text).strip("_.-") or "sidecar"


def staged_name(lake: Lake, writer: str, seq: int) -> str:
    """The path of a writer's `seq`th file: staged/<writer>/<writer>-<seq:012d>.parquet."""
    return lake.path(STAGED, writer, f"{writer}-{seq:012d}.parquet")


# staged/<writer>/.removed-through: the highest sequence `lake maintain` removed (the table holds
# it), so a writer whose own state went backwards never reuses a name the table already read
_REMOVED_MARK = ".removed-through"


def read_removed_mark(lake: Lake, writer: str) -> int:
    """The highest sequence of `writer` that maintain removed from staged/, -1 when none (or
    unreadable: then the staged files themselves are the only evidence, as before)."""
    try:
        with lake.fs.open_input_stream(lake.path(STAGED, writer, _REMOVED_MARK)) as stream:
            return int(stream.read().decode().strip())
    except (OSError, ValueError):
        return -1


def write_removed_mark(lake: Lake, writer: str, seq: int) -> None:
    """Record, before removing them, that `writer`'s staged files through `seq` are in the table
    (written to a temporary name, then moved over the mark: a reader sees the old or the new)."""
    final = lake.path(STAGED, writer, _REMOVED_MARK)
    if read_removed_mark(lake, writer) >= seq:
        return
    temporary = f"{final}.{os.getpid()}.tmp"
    with lake.fs.open_output_stream(temporary) as stream:
        stream.write(f"{seq}\n".encode())
    lake.fs.move(temporary, final)


def parse_staged(path: str) -> StagedName | None:
    """A staged file's writer and sequence from its path; None for any other name."""
    name = path.rsplit("/", 1)[-1]
    match = _STAGED_RE.match(name)
    if match is None:
        return None
    return StagedName(path=path, writer=match["writer"], seq=int(match["seq"]))


def private_files() -> None:
    """This process creates files 0600 and folders 0700 from here on (umask 077): what a process
    that writes the table (Iceberg metadata, whose column bounds name tenants; compacted data; a
    sqlite catalog) calls first, so they are as private as the sidecars' staged files."""
    os.umask(0o077)
