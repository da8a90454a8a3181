#!/usr/bin/env python3
# Makes the web client's icons (web/icon-*.png): `python3 scripts/web-icons.py web`.
# Draws the app icon: a rounded blue square with a white prompt chevron and
# underscore ("> _"), as PNG (pure Python: zlib + struct).
import struct, zlib, sys

def png(size, path, maskable=False):
    bg = (31, 95, 209)
    fg = (255, 255, 255)
    r = 0 if maskable else size * 0.18
    rows = []
    s = size
    def inside_round(x, y):
        if r == 0: return True
        cx = min(max(x, r), s - r); cy = min(max(y, r), s - r)
        return (x - cx) ** 2 + (y - cy) ** 2 <= r * r
    def dist_seg(px, py, ax, ay, bx, by):
        dx, dy = bx - ax, by - ay
        t = max(0, min(1, ((px - ax) * dx + (py - ay) * dy) / (dx * dx + dy * dy)))
        qx, qy = ax + t * dx, ay + t * dy
        return ((px - qx) ** 2 + (py - qy) ** 2) ** 0.5
    # maskable icons keep their content within the central 80%
    k = 0.8 if maskable else 1.0
    def sc(v): return s / 2 + (v - 0.5) * s * k
    w = s * 0.075 * k
    segs = [(sc(0.28), sc(0.32), sc(0.48), sc(0.5)), (sc(0.48), sc(0.5), sc(0.28), sc(0.68)), (sc(0.55), sc(0.68), sc(0.74), sc(0.68))]
    for y in range(s):
        row = bytearray([0])
        for x in range(s):
            px, py = x + 0.5, y + 0.5
            if not inside_round(px, py):
                row += bytes((0, 0, 0, 0)); continue
            d = min(dist_seg(px, py, *seg) for seg in segs)
            a = max(0.0, min(1.0, w - d + 0.5))
            c = tuple(int(bg[i] * (1 - a) + fg[i] * a) for i in range(3))
            row += bytes(c + (255,))
        rows.append(bytes(row))
    raw = b"".join(rows)
    def chunk(t, d): return struct.pack(">I", len(d)) + t + d + struct.pack(">I", zlib.crc32(t + d) & 0xffffffff)
    data = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", s, s, 8, 6, 0, 0, 0)) + chunk(b"IDAT", zlib.compress(raw, 9)) + chunk(b"IEND", b"")
    open(path, "wb").write(data)

png(192, sys.argv[1] + "/icon-192.png")
png(512, sys.argv[1] + "/icon-512.png")
png(512, sys.argv[1] + "/icon-maskable-512.png", maskable=True)
