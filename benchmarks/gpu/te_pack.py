#!/usr/bin/env python3
"""Pack Transformer Engine for a lent GPU host, small enough to travel in one device call.

Why: the host has no TE and no internet, and a call carries at most 64 MiB. The TE core wheel
(`transformer_engine_cu13`, 181 MB) holds `libtransformer_engine.so` (466 MiB) whose `.nv_fatbin`
section carries device code for every architecture (sm_75 ... sm_120, PTX and ELF). A Hopper host
only ever loads the sm_90/sm_90a entries, so this tool keeps the fatbin layout byte for byte
(headers, sizes, offsets) and zeroes the payloads of every other architecture and of the PTX (every
one of its 55 fatbins has an sm_90 cubin, which is checked); the zeroes then compress away. Nothing else in the library changes.

Runs here (CPU, pip reaches PyPI). Writes into OUT (default `.te/`, git-ignored):
  transformer_engine-V-py3-none-any.whl            the metapackage (pip version checks need it)
  transformer_engine_cuN-V-...-nolib.whl            the core wheel without the library
  libtransformer_engine.so.xz                       the library, other architectures zeroed
  transformer_engine_torch-V.tar.gz                 the PyTorch binding source (built on the host)
  einops, nvdlfw_inspect wheels                     pure-Python needs the hosts lack
  te-pack.json                                      sizes, hashes, what was kept and zeroed
`benchmarks/gpu/te.sh` installs this on the host.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import lzma
import shutil
import struct
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

FATBIN_MAGIC = 0xBA55ED50
LIB = "transformer_engine/wheel_lib/libtransformer_engine.so"
EXTRA_WHEELS = ("einops==0.8.1", "nvdlfw-inspect==0.2.2")


def _sections(elf: bytes | bytearray) -> dict[str, tuple[int, int]]:
    """Section name -> (file offset, size) of a 64-bit little-endian ELF file."""
    if elf[:4] != b"\x7fELF" or elf[4] != 2 or elf[5] != 1:
        raise ValueError("not a 64-bit little-endian ELF file")
    shoff = struct.unpack_from("<Q", elf, 0x28)[0]
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", elf, 0x3A)
    heads = [struct.unpack_from("<IIQQQQ", elf, shoff + i * shentsize) for i in range(shnum)]
    strtab = heads[shstrndx][4]
    out = {}
    for name, _typ, _flags, _addr, off, size in heads:
        end = elf.index(b"\0", strtab + name)
        out[elf[strtab + name:end].decode()] = (off, size)
    return out


def fatbin_entries(elf: bytes | bytearray):
    """Yield (entry_offset, header_size, payload_size, kind, arch, fatbin_offset) for every fatbin entry.

    Layout (CUDA fatbin, as read by cuobjdump): each fatbin starts with a 16-byte header
    (magic 0xBA55ED50, version u16, header size u16, payload size u64) followed by entries whose
    header gives kind u16 (1 PTX, 2 ELF), header size u32 at +4, payload size u64 at +8 and the
    SM architecture u32 at +28. Entries must tile each fatbin exactly, which is checked.
    """
    off, size = _sections(elf)[".nv_fatbin"]
    pos, end = off, off + size
    while pos < end:
        magic, _ver, hsize, fsize = struct.unpack_from("<IHHQ", elf, pos)
        if magic != FATBIN_MAGIC:
            pos += 8  # fatbins are 8-byte aligned; skip padding
            continue
        e, fend = pos + hsize, pos + hsize + fsize
        while e < fend:
            kind, _v, ehsize, psize = struct.unpack_from("<HHIQ", elf, e)
            arch = struct.unpack_from("<I", elf, e + 28)[0]
            yield e, ehsize, psize, kind, arch, pos
            e += ehsize + psize
        if e != fend:
            raise ValueError(f"fatbin at {pos}: entries end at {e}, header says {fend}")
        pos = fend


def keep_only_arch(elf: bytearray, archs: set[int], keep_ptx: bool = False) -> dict[str, int]:
    """Zero, in place, every fatbin payload a GPU of archs never loads.

    Kept: the ELF (cubin) entries of archs, and with keep_ptx their PTX too. Without PTX the
    driver cannot JIT, so every fatbin must carry a cubin for each kept arch: checked, else refused.
    """
    kept = zeroed = entries = kept_entries = 0
    fatbins: dict[int, set[int]] = {}
    for e, ehsize, psize, kind, arch, fatbin in list(fatbin_entries(elf)):
        entries += 1
        if kind == 2:
            fatbins.setdefault(fatbin, set()).add(arch)
        else:
            fatbins.setdefault(fatbin, set())
        if arch in archs and (kind == 2 or keep_ptx):
            kept += psize
            kept_entries += 1
        else:
            elf[e + ehsize:e + ehsize + psize] = bytes(psize)
            zeroed += psize
    missing = [f for f, have in fatbins.items() if not archs <= have]
    if kept_entries == 0 or (missing and not keep_ptx):
        raise ValueError(f"{len(missing)} of {len(fatbins)} fatbins have no cubin for sm_{sorted(archs)}: "
                         "refusing to strip (use --keep-ptx)")
    return {"entries": entries, "kept_entries": kept_entries, "kept_bytes": kept, "zeroed_bytes": zeroed,
            "fatbins": len(fatbins)}


def wheel_without(src: Path, dst: Path, member: str) -> bytes:
    """Copy wheel src to dst without member (dropped from RECORD too); return the member's bytes."""
    lib = b""
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w", zipfile.ZIP_DEFLATED) as zout:
        for info in zin.infolist():
            data = zin.read(info)
            if info.filename == member:
                lib = data
                continue
            if info.filename.endswith(".dist-info/RECORD"):
                data = b"".join(line + b"\n" for line in data.splitlines()
                                if not line.startswith(member.encode() + b","))
            zout.writestr(info, data)
    if not lib:
        raise ValueError(f"{src.name} has no {member}")
    return lib


def _pip_download(spec: str, dest: Path, sdist: bool = False) -> Path:
    before = set(dest.iterdir())
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", str(dest)]
    if sdist:
        cmd += ["--no-binary", ":all:", "--no-build-isolation"]
    else:
        cmd += ["--only-binary", ":all:", "--python-version", "3.12", "--implementation", "cp",
                "--platform", "manylinux_2_28_x86_64", "--platform", "any"]
    subprocess.run(cmd + [spec], check=True)
    new = sorted(set(dest.iterdir()) - before)
    if not new:  # already there from an earlier run
        name = spec.split("==")[0].replace("-", "_")
        new = sorted(p for p in dest.iterdir() if p.name.lower().startswith(name.lower()))
    return new[0]


def _download_sdist(spec: str, dest: Path) -> Path:
    """pip cannot download an sdist whose metadata needs torch to build; fetch the file itself."""
    name, version = spec.split("==")
    filename = f"{name.replace('-', '_')}-{version}.tar.gz"
    target = dest / filename
    if not target.exists():
        import urllib.request
        index = f"https://pypi.org/simple/{name}/"
        req = urllib.request.Request(index, headers={"Accept": "application/vnd.pypi.simple.v1+json"})
        with urllib.request.urlopen(req, timeout=60) as resp:
            files = json.load(resp)["files"]
        url = next(f["url"] for f in files if f["filename"] == filename)
        with urllib.request.urlopen(url, timeout=120) as resp:
            target.write_bytes(resp.read())
    return target


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--version", default="2.12.0", help="Transformer Engine version (default 2.12.0)")
    ap.add_argument("--cuda", default="13", choices=["12", "13"], help="CUDA major of the host's torch")
    ap.add_argument("--arch", default="90", help="SM architectures to keep, comma-separated (default 90)")
    ap.add_argument("--out", type=Path, default=Path(".te"))
    ap.add_argument("--keep-ptx", action="store_true", help="keep the kept archs' PTX too (bigger)")
    ap.add_argument("--xz-preset", type=int, default=6)
    args = ap.parse_args(argv)
    archs = {int(a) for a in args.arch.split(",")}
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        dl = Path(tmp)
        core = _pip_download(f"transformer-engine-cu{args.cuda}=={args.version}", dl)
        meta = _pip_download(f"transformer-engine=={args.version}", dl)
        sdist = _download_sdist(f"transformer-engine-torch=={args.version}", dl)
        extras = [_pip_download(spec, dl) for spec in EXTRA_WHEELS]
        # keep the wheel file name parseable by pip: the marker goes into the build tag slot
        stem = core.name[:-4].split("-")
        nolib = args.out / ("-".join(stem[:2] + ["1nolib"] + stem[2:]) + ".whl")
        lib = bytearray(wheel_without(core, nolib, LIB))
        original = {"bytes": len(lib), "sha256": hashlib.sha256(lib).hexdigest()}
        stats = keep_only_arch(lib, archs, args.keep_ptx)
        packed = lzma.compress(bytes(lib), preset=args.xz_preset)
        (args.out / "libtransformer_engine.so.xz").write_bytes(packed)
        for p in [meta, sdist, *extras]:
            shutil.copy2(p, args.out / p.name)
        manifest = {
            "transformer_engine": args.version, "cuda": args.cuda, "kept_archs": sorted(archs), "kept_ptx": args.keep_ptx,
            "core_wheel": {"name": core.name, "bytes": core.stat().st_size},
            "library_original": original,
            "library_stripped": {"bytes": len(lib), "sha256": hashlib.sha256(lib).hexdigest(),
                                 "xz_bytes": len(packed), **stats},
            "files": {p.name: p.stat().st_size for p in sorted(args.out.iterdir()) if p.is_file()},
        }
    (args.out / "te-pack.json").write_text(json.dumps(manifest, indent=2) + "\n")
    total = sum(manifest["files"].values())
    print(f"te_pack: {len(manifest['files'])} files, {total / 2**20:.1f} MiB in {args.out}/ "
          f"(library {original['bytes'] / 2**20:.0f} MiB -> kept {stats['kept_bytes'] / 2**20:.0f} MiB "
          f"of device code for sm_{','.join(map(str, sorted(archs)))}, xz {len(packed) / 2**20:.1f} MiB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
