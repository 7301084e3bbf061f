"""A process on a test host that knows a job's id and rendezvous port but not its secret
(test_hosts_2w.py): for `seconds`, it tries to register as each rank, to read the table and to stall the
rendezvous with a body it never sends, to read, write and delete Horovod's own keys (Gloo's addresses), and
records every answer. Writes OUT (JSON): the statuses per request."""

import http.client
import json
import socket
import sys
import time

addr, port, job_id, out, seconds = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], float(sys.argv[5])
answers = {"register": [], "table": [], "stall": [], "horovod": []}
deadline = time.monotonic() + seconds


def request(method, path, body=None):
    conn = http.client.HTTPConnection(addr, port, timeout=3)
    try:
        conn.request(method, path, body=body, headers={"Content-Length": str(len(body or b""))})
        return conn.getresponse().status
    finally:
        conn.close()


while time.monotonic() < deadline:
    for rank in (0, 1):
        entry = {"job_id": job_id, "rank": rank, "size": 2, "hostname": "intruder", "host_key": "intruder",
                 "ip": "10.0.0.9", "pid": 1, "probe_port": 1, "variables": []}
        try:
            answers["register"].append(request("PUT", "/hvdkeras/register", json.dumps(entry).encode()))
            answers["table"].append(request("GET", "/hvdkeras/table"))
            # Horovod's keys: a worker's address read, a false one written, a worker's key deleted.
            for method, path, body in (("GET", f"/global/{rank}", None), ("PUT", f"/global/{rank}", b"10.0.0.9:1"),
                                       ("DELETE", f"/global/{rank}", None)):
                answers["horovod"].append(request(method, path, body))
            # A registration that announces a body and never sends it: the server gives up on it alone.
            with socket.create_connection((addr, port), timeout=15) as sock:
                sock.sendall(b"PUT /hvdkeras/register HTTP/1.1\r\nContent-Length: 100\r\n\r\n")
                reply = sock.recv(64)
                answers["stall"].append(reply.split(b" ")[1].decode() if reply else "closed")
        except (OSError, http.client.HTTPException, IndexError):  # not listening yet, or gone
            answers["unreachable"] = answers.get("unreachable", 0) + 1
        time.sleep(0.2)
with open(out, "w") as f:
    json.dump(answers, f)
