"""`ablate bundle`: a folder of wheels that installs ablate on an offline node beside the node's own torch.

    1. ablate's wheel, built from a clean copy of this checkout's files (what `git ls-files` lists);
    2. the resolution for the node's Python and platform, metadata only (pip's dry run with --report): every
       package the node already has stands in as an empty placeholder wheel pinned at the node's version, so
       what travels fits what is there and nothing the node has is resolved again (torch above all);
    3. the wheels the node lacks, downloaded for its platform (`pip download --no-deps`); a cut download
       resumes from DIR.partial; DIR appears whole, with bundle.json (the commit, the target, what travelled
       and what was left to the node), or not at all.

On the node: `pip install --no-index --find-links DIR -r DIR/requirements.txt` (ablate, with the extras it was built
with, and pytest for the node check's CUDA tests).
Nothing here imports torch.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ablate.config.errors import AblateError

MARK = "present"  # the local-version label of a placeholder: 2.11.0+cu130 becomes 2.11.0+cu130.present
ALWAYS_LEFT = ("torch",)  # never travels: the node's own CUDA build is the point
CHECK_TOOLS = ("pytest",)  # what `python -m bench gpu` needs beyond ablate (its CUDA tests run under pytest)


@dataclass
class Target:
    python: str  # "3.12"
    platform: str  # "manylinux_2_28_x86_64"
    present: dict[str, str | None] = field(default_factory=dict)  # normalised name -> version (None: any)
    extras: tuple[str, ...] = ()

    @property
    def arch(self) -> str:
        """x86_64 of manylinux_2_28_x86_64 (an architecture may hold an underscore itself)."""
        m = re.fullmatch(r"(?:manylinux_\d+_\d+|manylinux\d+|musllinux_\d+_\d+|linux)_(\w+)", self.platform)
        if not m:
            raise AblateError(f"--platform {self.platform}: not a Linux platform tag; a GPU node's is like "
                              "manylinux_2_28_x86_64 (on the node, `python3 -c 'import packaging.tags as t; "
                              "print(next(t.sys_tags()))'` prints its own)")
        return m[1]

    def platforms(self) -> list[str]:
        """Every platform tag this one accepts (pip matches each exactly): manylinux_2_28 takes 2_28 down to 2_17
        and the legacy aliases."""
        m = re.fullmatch(r"manylinux_(\d+)_(\d+)_(\w+)", self.platform)
        if not m:
            return [self.platform]
        major, minor, arch = int(m[1]), int(m[2]), m[3]
        tags = [f"manylinux_{major}_{k}_{arch}" for k in range(minor, 16, -1)]
        if minor >= 17:
            tags.append(f"manylinux2014_{arch}")
        if arch in ("x86_64", "i686"):
            tags += [f"manylinux_2_12_{arch}", f"manylinux2010_{arch}", f"manylinux_2_5_{arch}", f"manylinux1_{arch}"]
        return tags

    def pip_target(self) -> list[str]:
        args = ["--python-version", self.python, "--implementation", "cp", "--only-binary=:all:"]
        for tag in self.platforms():
            args += ["--platform", tag]
        return args

    def markers(self) -> dict[str, str]:
        """The target's environment markers (a Linux node's)."""
        return {"python_version": self.python, "python_full_version": f"{self.python}.0", "os_name": "posix",
                "implementation_name": "cpython", "platform_python_implementation": "CPython",
                "implementation_version": f"{self.python}.0", "sys_platform": "linux", "platform_system": "Linux",
                "platform_machine": self.arch, "platform_release": "", "platform_version": ""}


def this_machine() -> tuple[str, str]:
    """This interpreter's Python (3.11) and this machine's platform tag (manylinux_2_36_x86_64)."""
    libc, version = platform.libc_ver()
    arch = platform.machine()
    if libc != "glibc" or not version:
        raise AblateError("--platform: this machine is not a glibc Linux; name the node's tag, e.g. "
                          "--platform manylinux_2_28_x86_64")
    major, minor = version.split(".")[:2]
    return f"{sys.version_info.major}.{sys.version_info.minor}", f"manylinux_{major}_{minor}_{arch}"


def normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def read_present(path: Path) -> dict[str, str | None]:
    """A node's `pip list --format freeze` (or `pip freeze`): name -> version; a bare name is "there, any version"."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise AblateError(f"--exclude-present {path}: {exc.strerror or exc}; write it on the node with "
                          "`python3 -m pip list --format freeze > node.txt`") from None
    present: dict[str, str | None] = {}
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line or line.startswith("-"):
            continue
        m = re.fullmatch(r"([A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:\[[^\]]*\])?\s*(?:(?:===?)\s*([^\s;]+))?(?:\s*@.*)?", line)
        if not m:
            raise AblateError(f"--exclude-present {path}, line {n}: {raw!r} is not `name==version` (what "
                              "`pip list --format freeze` writes) or a bare name")
        present[normalise(m[1])] = m[2]
    return present


# ---------------------------------------------------------------- the steps


def build_wheel(source: Path, into: Path, say: Callable[[str], None]) -> Path:
    """ablate's wheel from a clean copy of the checkout's files (no stale build/ of an earlier build inside)."""
    if not (source / "pyproject.toml").exists():
        raise AblateError(f"ablate bundle builds ablate's wheel from a checkout, and {source} is not one; run it from "
                          "a clone installed with `pip install -e .`")
    say(f"building ablate's wheel from {source}")
    with tempfile.TemporaryDirectory(prefix="ablate-bundle-src-") as tmp:
        copy = Path(tmp) / "src"
        for rel in _project_files(source):
            dst = copy / rel
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source / rel, dst)
        _pip(["wheel", "--no-deps", "--quiet", "-w", str(into), str(copy)], "building ablate's wheel")
    wheels = sorted(into.glob("ablate-*.whl"))
    if not wheels:
        raise AblateError(f"building ablate's wheel from {source} left no wheel in {into}")
    return wheels[-1]


def _project_files(source: Path) -> list[str]:
    try:
        out = subprocess.run(["git", "-C", str(source), "ls-files", "-co", "--exclude-standard"], capture_output=True,
                             text=True, check=True).stdout
        return [f for f in out.splitlines() if (source / f).is_file()]
    except (OSError, subprocess.CalledProcessError):  # no git: everything but what a build or a run leaves
        skip = {".git", ".venv", "build", "dist", "results", "__pycache__", ".pytest_cache"}
        return [str(p.relative_to(source)) for p in source.rglob("*") if p.is_file()
                and not skip.intersection(p.relative_to(source).parts) and ".egg-info" not in str(p)]


def commit_of(source: Path) -> dict[str, Any]:
    """The checkout's commit and whether its files differ from it (what a result names as its code)."""
    try:
        head = subprocess.run(["git", "-C", str(source), "rev-parse", "HEAD"], capture_output=True, text=True,
                              check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(source), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, check=True).stdout.strip()
        return {"commit": head, "dirty": bool(dirty)}
    except (OSError, subprocess.CalledProcessError):
        return {"commit": None, "dirty": None}


def placeholders(present: dict[str, str | None], into: Path) -> list[str]:
    """An empty wheel per versioned present package, at the node's version with a `present` local label; the
    constraints that make the resolver take exactly those."""
    into.mkdir(parents=True, exist_ok=True)
    constraints = []
    for name, version in sorted(present.items()):
        if version is None:
            continue
        stand_in = f"{version}.{MARK}" if "+" in version else f"{version}+{MARK}"
        dist = name.replace("-", "_")
        info = f"{dist}-{stand_in}.dist-info"
        files = {f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {stand_in}\n",
                 f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: ablate-bundle\nRoot-Is-Purelib: true\n"
                                  "Tag: py3-none-any\n"}
        files[f"{info}/RECORD"] = "".join(f"{k},,\n" for k in files) + f"{info}/RECORD,,\n"
        with zipfile.ZipFile(into / f"{dist}-{stand_in}-py3-none-any.whl", "w") as z:
            for arcname, text in files.items():
                z.writestr(arcname, text)
        constraints.append(f"{name}=={stand_in}")
    return constraints


def resolve(target: Target, wheel: Path, work: Path, say: Callable[[str], None]) -> list[dict[str, Any]]:
    """pip's resolution of ablate (with the extras) and the check's tools for the target: the report's items."""
    stand_ins = work / "present"
    constraints = placeholders(target.present, stand_ins)
    (work / "constraints.txt").write_text("\n".join(constraints) + "\n")
    wanted = [f"{wheel}[{','.join(target.extras)}]" if target.extras else str(wheel)]
    wanted += [tool for tool in CHECK_TOOLS if tool not in target.present]
    say(f"resolving for Python {target.python} on {target.platform} ({len(constraints)} packages pinned at the "
        f"node's versions; metadata only)")
    report = work / "report.json"
    _pip(["install", "--dry-run", "--ignore-installed", "--quiet", "--report", str(report), "--target",
          str(work / "never-written"), *target.pip_target(), "--find-links", str(stand_ins), "--constraint",
          str(work / "constraints.txt"), *wanted], "resolving the bundle")
    return json.loads(report.read_text())["install"]


def travelling(items: list[dict[str, Any]], target: Target) -> list[dict[str, Any]]:
    """What the node lacks: the resolution's packages reachable from ablate and the check's tools without passing
    through a package the node has (whose own dependencies it has too). Placeholders and torch never travel."""
    from packaging.requirements import InvalidRequirement, Requirement

    by_name = {normalise(i["metadata"]["name"]): i for i in items}
    left = {normalise(n) for n in (*target.present, *ALWAYS_LEFT)}
    env = target.markers()
    roots = [("ablate", frozenset(target.extras))] + [(t, frozenset()) for t in CHECK_TOOLS if t not in left]
    extras_seen: dict[str, set[str]] = {}
    todo = list(roots)
    while todo:
        name, extras = todo.pop()
        if name in left or name not in by_name:
            continue
        seen = extras_seen.get(name)
        if seen is not None and extras <= seen:
            continue
        extras_seen.setdefault(name, set()).update(extras)
        for text in by_name[name]["metadata"].get("requires_dist") or []:
            try:
                req = Requirement(text)
            except InvalidRequirement:
                continue
            if req.marker is None or any(req.marker.evaluate({**env, "extra": e}) for e in ("", *extras)):
                todo.append((normalise(req.name), frozenset(req.extras)))
    return [by_name[n] for n in sorted(extras_seen) if n != "ablate"]


def download(items: list[dict[str, Any]], target: Target, into: Path, say: Callable[[str], None]) -> None:
    """The wheels for the target, a few at a time with progress; pip skips those a cut earlier run left."""
    pins = [f"{i['metadata']['name']}=={i['metadata']['version']}" for i in items]
    chunk = 8
    for k in range(0, len(pins), chunk):
        _pip(["download", "--no-deps", "--quiet", "--dest", str(into), *target.pip_target(), *pins[k:k + chunk]],
             "downloading wheels")
        done = min(k + chunk, len(pins))
        say(f"  {done}/{len(pins)} wheels, {_mib(_size(into.glob('*.whl'))):.1f} MiB")


def _pip(args: list[str], what: str) -> None:
    proc = subprocess.run([sys.executable, "-m", "pip", *args, "--disable-pip-version-check"], capture_output=True,
                          text=True)
    if proc.returncode != 0:
        lines = [ln for ln in (proc.stderr + proc.stdout).splitlines() if "is ignored" not in ln and ln.strip()]
        raise AblateError(f"{what} failed (pip exit {proc.returncode}):\n" + "\n".join(lines[-25:]))


def _size(paths: Any) -> int:
    return sum(p.stat().st_size for p in paths)


def _mib(n: int) -> float:
    return n / 2**20


# ---------------------------------------------------------------- the whole


def bundle(out: Path, target: Target, source: Path, say: Callable[[str], None] = print) -> dict[str, Any]:
    """Build the bundle into `out` (replaced whole when it is an earlier bundle); bundle.json's content."""
    out = out.resolve()
    if out.exists() and any(out.iterdir()) and not (out / "bundle.json").exists():
        raise AblateError(f"-o {out}: the folder holds files that are not an earlier bundle; name a new or empty one")
    partial = out.with_name(out.name + ".partial")  # kept when cut: the next run resumes its downloads
    with tempfile.TemporaryDirectory(prefix="ablate-bundle-") as tmp:  # nothing beside -o until it resolves
        work = Path(tmp)
        built = build_wheel(source, work / "ablate-wheel", say)
        items = resolve(target, built, work, say)
        partial.mkdir(parents=True, exist_ok=True)
        for old in partial.glob("ablate-*.whl"):
            old.unlink()
        wheel = Path(shutil.copy2(built, partial / built.name))
    wheels = travelling(items, target)
    keep = {f"{normalise(i['metadata']['name'])}=={i['metadata']['version']}" for i in wheels}
    for stale in partial.glob("*.whl"):  # from a cut run for another target or version
        if stale != wheel and _pin_of(stale.name) not in keep:
            stale.unlink()
    say(f"downloading {len(wheels)} wheels the node lacks (torch and {len(target.present)} present packages stay "
        f"as they are)")
    download(wheels, target, partial, say)
    left = sorted({normalise(i["metadata"]["name"]) for i in items} - {normalise(i["metadata"]["name"]) for i in wheels}
                  - {"ablate"})
    info = _describe(target, source, wheel, left, partial)
    (partial / "bundle.json").write_text(json.dumps(info, indent=1) + "\n")
    (partial / "requirements.txt").write_text("\n".join(info["requirements"]) + "\n")
    if out.exists():
        shutil.rmtree(out)
    os.replace(partial, out)
    say(f"bundle: {out} ({len(info['wheels'])} wheels, {info['mib']:.1f} MiB); on the node: "
        + info["install"].replace("DIR", str(out)))
    return info


def _pin_of(filename: str) -> str:
    name, version = filename.split("-")[:2]
    return f"{normalise(name)}=={version}"


def _describe(target: Target, source: Path, wheel: Path, left: list[str], folder: Path) -> dict[str, Any]:
    """bundle.json: `left_to_node` is what the resolution took from the node (present packages it needs, torch)."""
    files = sorted(folder.glob("*.whl"))
    spec = f"ablate[{','.join(target.extras)}]" if target.extras else "ablate"
    return {"created": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"), "ablate": wheel.name,
            **commit_of(source), "python": target.python, "platform": target.platform, "extras": list(target.extras),
            "requirements": [spec, *(t for t in CHECK_TOOLS if t not in target.present)],
            "install": "python3 -m pip install --no-index --find-links DIR -r DIR/requirements.txt",
            "left_to_node": left, "present_given": len(target.present),
            "wheels": [{"file": f.name, "bytes": f.stat().st_size} for f in files],
            "bytes": _size(files), "mib": round(_mib(_size(files)), 2)}

