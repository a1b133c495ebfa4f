"""benchmarks/gpu/te_pack.py: the Transformer Engine library is cut to one GPU architecture by
zeroing fatbin payloads, never by moving a byte. Checked on a synthetic ELF whose fatbins are laid
out as the real libtransformer_engine.so 2.12.0 is (55 fatbins; PTX kind 1, cubin kind 2)."""

from __future__ import annotations

import importlib.util
import struct

import pytest
from conftest import ROOT

spec = importlib.util.spec_from_file_location("te_pack", ROOT / "benchmarks" / "gpu" / "te_pack.py")
te_pack = importlib.util.module_from_spec(spec)
spec.loader.exec_module(te_pack)


def _entry(kind: int, arch: int, payload: bytes) -> bytes:
    head = bytearray(64)
    struct.pack_into("<HHIQ", head, 0, kind, 0x0101, 64, len(payload))
    struct.pack_into("<I", head, 28, arch)
    return bytes(head) + payload


def _fatbin(entries: list[tuple[int, int, bytes]]) -> bytes:
    body = b"".join(_entry(*e) for e in entries)
    return struct.pack("<IHHQ", te_pack.FATBIN_MAGIC, 1, 16, len(body)) + body


def _elf(section: bytes) -> bytearray:
    """A 64-bit little-endian ELF file with sections: null, .nv_fatbin, .shstrtab."""
    names = b"\0.nv_fatbin\0.shstrtab\0"
    data_off = 64
    str_off = data_off + len(section)
    sh_off = (str_off + len(names) + 7) // 8 * 8
    out = bytearray(sh_off + 3 * 64)
    out[:4] = b"\x7fELF"
    out[4], out[5] = 2, 1
    struct.pack_into("<Q", out, 0x28, sh_off)
    struct.pack_into("<HHH", out, 0x3A, 64, 3, 2)
    out[data_off:data_off + len(section)] = section
    out[str_off:str_off + len(names)] = names
    struct.pack_into("<IIQQQQ", out, sh_off + 64, 1, 1, 0, 0, data_off, len(section))
    struct.pack_into("<IIQQQQ", out, sh_off + 128, 12, 3, 0, 0, str_off, len(names))
    return out


def _two_fatbins() -> bytearray:
    a = _fatbin([(1, 80, b"P" * 24), (2, 80, b"A" * 40), (2, 90, b"H" * 32), (1, 90, b"Q" * 16)])
    b = _fatbin([(2, 90, b"I" * 8), (2, 100, b"B" * 48)])
    return _elf(a + bytes(8) + b)  # 8 bytes of padding between fatbins, as the linker leaves


def test_every_entry_is_found_and_entries_tile_each_fatbin():
    elf = _two_fatbins()
    found = [(kind, arch, size) for _, _, size, kind, arch, _ in te_pack.fatbin_entries(elf)]
    assert found == [(1, 80, 24), (2, 80, 40), (2, 90, 32), (1, 90, 16), (2, 90, 8), (2, 100, 48)]


def test_only_the_kept_cubins_survive_and_nothing_moves():
    elf = _two_fatbins()
    before = bytes(elf)
    stats = te_pack.keep_only_arch(elf, {90})
    assert len(elf) == len(before)
    assert stats["kept_bytes"] == 32 + 8 and stats["zeroed_bytes"] == 24 + 40 + 16 + 48
    assert b"H" * 32 in elf and b"I" * 8 in elf           # sm_90 cubins intact
    for gone in (b"P", b"A", b"Q", b"B"):                  # other archs and the PTX zeroed
        assert gone * 8 not in elf
    # headers untouched: the same entries are still found at the same offsets
    assert [e[:3] for e in te_pack.fatbin_entries(elf)] == [e[:3] for e in te_pack.fatbin_entries(before)]


def test_keep_ptx_keeps_the_kept_archs_ptx():
    elf = _two_fatbins()
    te_pack.keep_only_arch(elf, {90}, keep_ptx=True)
    assert b"Q" * 16 in elf and b"P" * 8 not in elf


def test_refuses_when_a_fatbin_lacks_a_cubin_for_the_arch():
    """Without PTX the driver cannot JIT: a fatbin with no sm_100 cubin would fail at load time."""
    with pytest.raises(ValueError, match="no cubin"):
        te_pack.keep_only_arch(_two_fatbins(), {100})


def test_refuses_a_file_that_is_not_elf64():
    with pytest.raises(ValueError, match="ELF"):
        list(te_pack.fatbin_entries(bytearray(b"MZ" + bytes(200))))


def test_a_broken_fatbin_size_is_an_error_not_a_silent_cut():
    elf = _two_fatbins()
    off = bytes(elf).index(struct.pack("<I", te_pack.FATBIN_MAGIC))
    struct.pack_into("<Q", elf, off + 8, 1000)  # claims more than its entries hold
    with pytest.raises(ValueError):
        list(te_pack.fatbin_entries(elf))
