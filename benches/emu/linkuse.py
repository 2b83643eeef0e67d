#!/usr/bin/env python3
"""Link use over time from a linktrace.py file: one row per emulated link (rank, interface),
one character per BIN seconds (blank idle ... @ full, relative to RATE Mbit/s), and the mean
use over the active window. usage: linkuse.py TRACE RATE_MBIT [BIN_S]
Example: benches/emu/linktrace.py /tmp/t.txt 0.01 & collbench --emulate ring:4 ...;
         benches/emu/linkuse.py /tmp/t.txt 400 0.05"""
import sys, collections
rate = float(sys.argv[2])*1e6/8  # bytes/s of a link
B = float(sys.argv[3]) if len(sys.argv)>3 else 0.05
data = collections.defaultdict(list)
for l in open(sys.argv[1]):
    t, r, i, b = l.split(); 
    if i.startswith("emu0"): continue
    data[(int(r), i)].append((float(t), int(b)))
keys = sorted(data)
# find active window
tmin = 1e9; tmax = 0
for k in keys:
    s = data[k]
    for (t0,b0),(t1,b1) in zip(s, s[1:]):
        if b1-b0 > 100000: tmin=min(tmin,t0); tmax=max(tmax,t1)
print("active %.3f..%.3f (%.3f s)" % (tmin, tmax, tmax-tmin))
nb = int((tmax-tmin)/B)+1
print("link      " + "".join(str((j//10)%10) if j%10==0 else " " for j in range(nb)))
tot = {}
for k in keys:
    s = data[k]; row = []
    import bisect
    ts = [t for t,_ in s]
    def at(t):
        i = bisect.bisect_left(ts, t)
        if i==0: return s[0][1]
        if i>=len(s): return s[-1][1]
        (ta,ba),(tb,bb) = s[i-1], s[i]
        return ba + (bb-ba)*(t-ta)/(tb-ta) if tb>ta else bb
    for j in range(nb):
        a = tmin + j*B; u = (at(a+B)-at(a))/(B*rate)
        row.append(" .:-=+*#%@"[min(9, int(u*9.99))] if u>0.02 else " ")
    tot[k] = (at(tmax)-at(tmin))/((tmax-tmin)*rate)
    print("%d %-7s %s %3.0f%%" % (k[0], k[1], "".join(row), 100*tot[k]))
