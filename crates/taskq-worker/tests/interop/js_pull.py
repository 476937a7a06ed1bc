"""Consumes N jobs that taskq put, through taskq's own durable consumer
(on a work-queue stream only one consumer may take a subject), acking each
with the server's confirmation.

usage: js_pull.py NATS_URL TUBE DIR N
Each body is written to DIR/out<stream sequence>; DIR/config gets the
consumer's ack wait (seconds), max ack pending and filter subject as bound,
one per line.
"""

import asyncio
import sys

import nats


async def main(url, tube, d, n):
    nc = await nats.connect(url, connect_timeout=5, max_reconnect_attempts=0)
    js = nc.jetstream(timeout=5)
    # Binds to the existing durable: nats-py looks it up and creates one only
    # when it is missing.
    sub = await js.pull_subscribe(f"taskq.{tube}", durable=f"taskq-{tube}", stream="TASKQ")
    info = await js.consumer_info("TASKQ", f"taskq-{tube}")
    with open(f"{d}/config", "w") as f:
        f.write(f"{info.config.ack_wait}\n{info.config.max_ack_pending}\n{info.config.filter_subject}\n")
    got = 0
    while got < n:
        for m in await sub.fetch(n - got, timeout=5):
            with open(f"{d}/out{m.metadata.sequence.stream}", "wb") as f:
                f.write(m.data)
            await m.ack_sync(timeout=5)
            got += 1
    await nc.close()


if __name__ == "__main__":
    url, tube, d, n = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    asyncio.run(main(url, tube, d, n))
