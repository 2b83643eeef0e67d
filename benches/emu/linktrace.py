#!/usr/bin/env python3
"""Samples tx bytes of every interface in every emulated rank namespace (via /proc/PID/net/dev
of the rank processes) every DT seconds until no rank is left; writes t rank iface txbytes."""
import os, sys, time
DT = float(sys.argv[2]) if len(sys.argv) > 2 else 0.01
out = open(sys.argv[1], "w")
def ranks():
    res = {}
    for p in os.listdir("/proc"):
        if not p.isdigit(): continue
        try:
            env = open(f"/proc/{p}/environ", "rb").read().split(b"\0")
        except Exception: continue
        if b"TOPOCCL_EMULATED=1" not in env and not any(e.startswith(b"TOPOCCL_EMULATED") for e in env): continue
        r = [e for e in env if e.startswith(b"RANK=")]
        try: comm = open(f"/proc/{p}/comm").read().strip()
        except Exception: continue
        if r and comm == "collbench": res[int(r[0][5:])] = p
    return res
t0 = time.time(); seen = False; rk = {}; last_scan = 0
while True:
    now = time.time()
    if now - last_scan > 1.0 or not rk:
        rk = ranks(); last_scan = now
        if rk: seen = True
        elif seen: break
        elif now - t0 > 600: break
    for r, p in rk.items():
        try: lines = open(f"/proc/{p}/net/dev").read().splitlines()[2:]
        except Exception: continue
        for l in lines:
            name, rest = l.split(":", 1)
            name = name.strip()
            if name == "lo": continue
            f = rest.split()
            out.write(f"{now-t0:.4f} {r} {name} {f[8]}\n")
    time.sleep(DT)
