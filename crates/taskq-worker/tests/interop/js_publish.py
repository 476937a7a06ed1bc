"""Publishes plain messages (no taskq headers) to a taskq tube's subject
with nats-py's JetStream publish, and writes each one's stream sequence.

usage: js_publish.py NATS_URL SUBJECT DIR N
Body i is read from DIR/in<i>; its sequence is written to DIR/id<i>.
"""

import asyncio
import sys

import nats


async def main(url, subject, d, n):
    nc = await nats.connect(url, connect_timeout=5, max_reconnect_attempts=0)
    js = nc.jetstream(timeout=5)
    for i in range(n):
        with open(f"{d}/in{i}", "rb") as f:
            body = f.read()
        ack = await js.publish(subject, body, stream="TASKQ")
        with open(f"{d}/id{i}", "w") as f:
            f.write(str(ack.seq))
    await nc.close()


if __name__ == "__main__":
    url, subject, d, n = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    asyncio.run(main(url, subject, d, n))
