#!/usr/bin/env python3
"""The scraper of scripts/bench-pid1.sh: scrapes tfinit's /metrics every 100 ms (a full GET,
read to the end) and keeps one more client connected that sends a request and never reads the
answer, reconnected every 50 ms (the init it talks to is replaced every trial). It runs until
SIGTERM, then prints how many scrapes were answered and how many stuck clients were connected.

    scripts/bench/scraper.py HOST PORT
"""
import signal
import socket
import sys
import time

host, port = sys.argv[1], int(sys.argv[2])
done = False


def stop(*_):
    global done
    done = True


signal.signal(signal.SIGTERM, stop)
scrapes = answered = stuck_connected = 0
stuck = None
stuck_since = 0.0
next_scrape = 0.0
while not done:
    now = time.monotonic()
    if stuck is not None and now - stuck_since > 0.05:
        stuck.close()
        stuck = None
    if stuck is None:
        try:
            s = socket.create_connection((host, port), timeout=0.05)
            s.sendall(b"GET /metrics HTTP/1.1\r\nHost: bench\r\n\r\n")
            stuck, stuck_since = s, now
            stuck_connected += 1
        except OSError:
            pass
    if now >= next_scrape:
        next_scrape = now + 0.1
        scrapes += 1
        try:
            with socket.create_connection((host, port), timeout=0.5) as s:
                s.sendall(b"GET /metrics HTTP/1.1\r\nHost: bench\r\nConnection: close\r\n\r\n")
                body = b""
                while chunk := s.recv(65536):
                    body += chunk
                if b"tfinit_build_info" in body:
                    answered += 1
        except OSError:
            pass
    time.sleep(0.002)
print(f"scrapes {scrapes} answered {answered} stuck_clients {stuck_connected}")
