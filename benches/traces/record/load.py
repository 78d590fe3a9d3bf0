"""Background load on a vLLM server: `waves` (concurrency 0,1,2,3,2,1 for 60 s each,
repeated), `bursty` (idle 5-60 s, then a burst of 4-16 requests at once), or
`steady` (concurrency 2 forever). Requests: 64 prompt tokens of random words,
32 output tokens, ignore_eos."""
import asyncio, random, sys, time, json
import aiohttp

URL = sys.argv[2]
MODE = sys.argv[1]
WORDS = "the of and to in is for on that with as by at from it an be this are or".split()

def body():
    return {"model": "tiny", "prompt": " ".join(random.choice(WORDS) for _ in range(64)),
            "max_tokens": 32, "ignore_eos": True, "temperature": 0}

async def one(session):
    try:
        async with session.post(URL + "/v1/completions", json=body(), timeout=aiohttp.ClientTimeout(total=120)) as r:
            await r.read()
    except Exception as e:
        print("load request failed:", e, flush=True)

async def worker(session, level, index):
    while True:
        if index < level[0]:
            await one(session)
        else:
            await asyncio.sleep(0.2)

async def main():
    random.seed(int(sys.argv[3]) if len(sys.argv) > 3 else 1)
    async with aiohttp.ClientSession() as session:
        if MODE in ("waves", "steady"):
            level = [2 if MODE == "steady" else 0]
            tasks = [asyncio.create_task(worker(session, level, i)) for i in range(4)]
            pattern = [0, 1, 2, 3, 2, 1]
            step = 0
            while True:
                if MODE == "waves":
                    level[0] = pattern[step % len(pattern)]
                    print(time.strftime("%H:%M:%S"), "level", level[0], flush=True)
                step += 1
                await asyncio.sleep(60)
        else:
            while True:
                idle = random.uniform(5, 60)
                await asyncio.sleep(idle)
                n = random.randint(4, 16)
                print(time.strftime("%H:%M:%S"), "burst", n, flush=True)
                await asyncio.gather(*(one(session) for _ in range(n)))

asyncio.run(main())
