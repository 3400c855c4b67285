#!/usr/bin/python3
"""relay.py LISTEN_ADDR:PORT TARGET_ADDR:PORT CONTROL_FILE

A fault-injecting TCP relay for the multi-host tests: forwards every connection made to LISTEN
to TARGET, byte for byte, and obeys the command last written to CONTROL_FILE (read every 50 ms):
  pass        forward at once (the default)
  delay MS    hold every chunk MS milliseconds before forwarding it
  pause       stop forwarding (connections stay open; bytes wait) until another command
  cut         close every open connection (once per write of the command); new ones are refused
Prints "relay: listening" once it accepts, and one line per connection and command.
"""

import asyncio
import os
import sys

state = {"mode": "pass", "delay": 0.0, "cuts": 0}
connections = set()


async def watch(path):
    last = None
    while True:
        try:
            with open(path, encoding="utf-8") as f:
                text = f.read().strip()
            stamp = os.stat(path).st_mtime_ns
        except OSError:
            text, stamp = "pass", None
        if (text, stamp) != last:
            last = (text, stamp)
            words = text.split() or ["pass"]
            state["mode"] = words[0]
            state["delay"] = float(words[1]) / 1000 if words[0] == "delay" and len(words) > 1 else 0.0
            print(f"relay: {text or 'pass'}", flush=True)
            if words[0] == "cut":
                for writer in list(connections):
                    writer.transport.abort()
        await asyncio.sleep(0.05)


async def pump(reader, writer):
    try:
        while True:
            data = await reader.read(65536)
            if not data:
                break
            while state["mode"] == "pause":
                await asyncio.sleep(0.01)
            if state["mode"] == "cut":
                break
            if state["delay"] > 0:
                await asyncio.sleep(state["delay"])
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        writer.transport.abort()


async def handle(client_reader, client_writer, target):
    if state["mode"] == "cut":
        client_writer.transport.abort()
        return
    # The target may not listen yet (the store starts with rank 0): keep trying for a while, as
    # the client itself would have, instead of resetting a connection it thinks is made.
    for attempt in range(300):
        try:
            server_reader, server_writer = await asyncio.open_connection(*target)
            break
        except OSError as e:
            if attempt == 299:
                print(f"relay: cannot reach {target}: {e}", flush=True)
                client_writer.transport.abort()
                return
            await asyncio.sleep(0.1)
    connections.update({client_writer, server_writer})
    print("relay: connection", flush=True)
    await asyncio.gather(pump(client_reader, server_writer), pump(server_reader, client_writer))
    connections.difference_update({client_writer, server_writer})


async def main(listen, target, control):
    host, port = listen.rsplit(":", 1)
    thost, tport = target.rsplit(":", 1)
    server = await asyncio.start_server(lambda r, w: handle(r, w, (thost, int(tport))), host,
                                        int(port), reuse_address=True)
    print("relay: listening", flush=True)
    async with server:
        await asyncio.gather(server.serve_forever(), watch(control))


if __name__ == "__main__":
    if len(sys.argv) != 4:
        sys.exit("usage: relay.py LISTEN_ADDR:PORT TARGET_ADDR:PORT CONTROL_FILE")
    asyncio.run(main(*sys.argv[1:]))
