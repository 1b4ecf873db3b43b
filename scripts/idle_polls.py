#!/usr/bin/env python3
# Holds N idle long-polls (POST /v1/fetch, wait_ms 30000, an empty queue) against a conveyor
# server and prints the server's CPU share over SECONDS: idle_polls.py PORT N SERVER_PID SECONDS.
# Raise the descriptor limit first (ulimit -n 8192) for N near 1,000.
import asyncio, json, os, sys, time
url_host, url_port = "127.0.0.1", int(sys.argv[1]); n = int(sys.argv[2]); pid = int(sys.argv[3]); secs = float(sys.argv[4])
body = lambda i: json.dumps({"worker_id": f"idle-{i}", "queues": ["idle"], "max": 1, "wait_ms": 30000}).encode()
async def poller(i, stop):
    r, w = await asyncio.open_connection(url_host, url_port)
    while not stop.is_set():
        b = body(i)
        w.write(b"POST /v1/fetch HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(b) + b)
        await w.drain()
        head = await r.readuntil(b"\r\n\r\n")
        length = int([l for l in head.split(b"\r\n") if l.lower().startswith(b"content-length")][0].split(b":")[1])
        await r.readexactly(length)
    w.close()
def cpu():
    f = open(f"/proc/{pid}/stat").read().split(")")[1].split()
    return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")
async def main():
    stop = asyncio.Event()
    tasks = [asyncio.create_task(poller(i, stop)) for i in range(n)]
    await asyncio.sleep(5)  # all connected and waiting
    c0, t0 = cpu(), time.time()
    await asyncio.sleep(secs)
    c1, t1 = cpu(), time.time()
    print(json.dumps({"long_polls": n, "seconds": round(t1 - t0, 1), "server_cpu_pct_of_a_core": round(100 * (c1 - c0) / (t1 - t0), 2)}))
    stop.set(); os._exit(0)
asyncio.run(main())
