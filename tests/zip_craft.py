"""Zips written in torch's style (stored records, flags 0x0808, local CRC and sizes 0) by hand, with control over
the data descriptors and the central directory's signature; and a record's last 4 bytes chosen to give it any
CRC-32 (CRC-32 is linear over GF(2)).  For tests of readers that share one parse between files
(tests/test_zip_layouts.py)."""
import io
import struct
import zipfile
import zlib


def torch_entries(pt_bytes):
    """``[(name, data)]`` of the records of a torch.save file's bytes."""
    z = zipfile.ZipFile(io.BytesIO(pt_bytes))
    return [(i.filename, z.read(i)) for i in z.infolist()]


def build(entries, desc="sig", flags=0x0808, vn=20, vm=20, crcs=None, cd_sig=b"PK\x01\x02"):
    """``(zip bytes, {name: {"lho", "data", "end", "cen_crc"}})`` of ``entries`` (``[(name, data)]``);
    ``desc``: each record's data descriptor, ``"sig"`` (16 bytes), ``"nosig"`` (12) or ``"none"``, or a list of
    those; ``crcs``: the CRC-32 the headers state (default: the data's); ``cd_sig``: the central directory's first
    signature."""
    out = bytearray()
    cen = bytearray()
    pos = {}
    for k, (name, data) in enumerate(entries):
        nb = name.encode()
        crc = zlib.crc32(data) if crcs is None else crcs[k]
        lho = len(out)
        out += struct.pack("<4sHHHHHIIIHH", b"PK\x03\x04", vn, flags, 0, 0, 0x21, 0, 0, 0, len(nb), 0) + nb
        pos[name] = {"lho": lho, "data": len(out)}
        out += data
        pos[name]["end"] = len(out)
        d = desc[k] if isinstance(desc, list) else desc
        if d == "sig":
            out += struct.pack("<4sIII", b"PK\x07\x08", crc, len(data), len(data))
        elif d == "nosig":
            out += struct.pack("<III", crc, len(data), len(data))
        cen += struct.pack("<4sHHHHHHIIIHHHHHII", b"PK\x01\x02", vm, vn, flags, 0, 0, 0x21, crc, len(data),
                           len(data), len(nb), 0, 0, 0, 0, 0, lho) + nb
        pos[name]["cen_crc"] = None  # filled below
    cd = len(out)
    # central CRC field offsets
    at = cd
    for name, data in entries:
        pos[name]["cen_crc"] = at + 16
        at += 46 + len(name.encode())
    cen[0:4] = cd_sig
    out += cen
    out += struct.pack("<4sHHHHIIH", b"PK\x05\x06", 0, 0, len(entries), len(entries), len(cen), cd, 0)
    return bytes(out), pos


def forge_crc(data: bytes, target: int) -> bytes:
    """``data`` with its last 4 bytes replaced so that its CRC-32 is ``target`` (a linear solve over GF(2))."""
    base = bytearray(data)
    base[-4:] = b"\0\0\0\0"
    c0 = zlib.crc32(bytes(base))
    cols = []
    for bit in range(32):
        b = bytearray(base)
        b[-4 + bit // 8] ^= 1 << (bit % 8)
        cols.append(zlib.crc32(bytes(b)) ^ c0)
    want = c0 ^ target
    # solve sum(x_i * cols[i]) = want over GF(2)
    rows = [(cols[i], 1 << i) for i in range(32)]
    basis = {}
    for v, m in rows:
        for p in range(31, -1, -1):
            if not (v >> p) & 1:
                continue
            if p in basis:
                v ^= basis[p][0]; m ^= basis[p][1]
            else:
                basis[p] = (v, m)
                break
    x, v = 0, want
    for p in range(31, -1, -1):
        if (v >> p) & 1:
            v ^= basis[p][0]; x ^= basis[p][1]
    assert v == 0
    b = bytearray(base)
    b[-4:] = x.to_bytes(4, "little")
    assert zlib.crc32(bytes(b)) == target
    return bytes(b)


def build_fields(entries, cd_extra=None, cd_comment=None, eocd_comment=b"", ext_attr=None):
    """``(zip bytes, {"records": [{"lho", "data", "end", "crc", "cen"}], "cd", "eocd"})`` of ``entries``
    (``[(name bytes, data)]``, stored, flags 0x0808, 16-byte descriptors with their signature), with chosen
    central-directory extra fields, comments and external attributes (``{entry index: value}``) and end-record
    comment: fields a reader of the end records may take for a zip64 locator or record."""
    cd_extra = cd_extra or {}
    cd_comment = cd_comment or {}
    out = bytearray()
    info = []
    for k, (nb, data) in enumerate(entries):
        lho = len(out)
        out += struct.pack("<4sHHHHHIIIHH", b"PK\x03\x04", 20, 0x0808, 0, 0, 0x21, 0, 0, 0, len(nb), 0) + nb
        d0 = len(out)
        out += data
        end = len(out)
        crc = zlib.crc32(data)
        out += struct.pack("<4sIII", b"PK\x07\x08", crc, len(data), len(data))
        info.append({"lho": lho, "data": d0, "end": end, "crc": crc})
    cd = len(out)
    cen = bytearray()
    for k, (nb, data) in enumerate(entries):
        info[k]["cen"] = cd + len(cen)
        x, c = cd_extra.get(k, b""), cd_comment.get(k, b"")
        cen += struct.pack("<4sHHHHHHIIIHHHHHII", b"PK\x01\x02", 20, 20, 0x0808, 0, 0, 0x21, info[k]["crc"],
                           len(data), len(data), len(nb), len(x), len(c), 0, 0, (ext_attr or {}).get(k, 0),
                           info[k]["lho"]) + nb + x + c
    out += cen
    eocd = len(out)
    out += struct.pack("<4sHHHHIIH", b"PK\x05\x06", 0, 0, len(entries), len(entries), len(cen), cd,
                       len(eocd_comment)) + eocd_comment
    return bytes(out), {"records": info, "cd": cd, "eocd": eocd}
