/**
 * Measurement, not a test (no timed assertions): proxy throughput and added latency against a
 * direct connection to the same test-internet server in the same run. Runs only with
 * SANDNODE_EGRESS_MEASURE=1 and prints its numbers to stderr:
 *
 *   SANDNODE_EGRESS_MEASURE=1 bash deploy/node-env.sh npx jest \
 *     services/server/src/network/__tests__/egress-measure.it.test.ts --selectProjects integration
 *
 * "direct" is curl on the host to the test internet (one veth hop: the node's FORWARD chain may
 * be Docker's policy drop, and this test never edits tables it did not make); "proxied" is curl
 * in the sandbox netns through the nft redirect and the egress proxy (two veth hops + proxy).
 * Latency: N sequential requests, each on a new connection (`Connection: close`), curl's
 * time_total; throughput: one GET of SIZE bytes, and the CPU time (user+sys) this process (the
 * proxy) spent per MiB of it: the proxy's cost whatever else the machine runs.
 */
import { execFile, spawnSync } from 'node:child_process';
import { promisify } from 'node:util';
import { PARTS, describeWith, type Part } from '@sandnode/testkit';
import { startEgressFixture, type EgressFixture } from './egress-fixture';

jest.setTimeout(300_000);
const run = promisify(execFile);
const NFT: Part = { name: 'nftables (apt-get install nftables)', present: () => spawnSync('nft', ['--version'], { stdio: 'ignore' }).status === 0, ciProvides: true };
const ON: Part = { name: 'SANDNODE_EGRESS_MEASURE=1 (a measurement, off by default)', present: () => process.env.SANDNODE_EGRESS_MEASURE === '1', ciProvides: false };
const N = Number(process.env.SANDNODE_EGRESS_MEASURE_N ?? 300);
const SIZE = Number(process.env.SANDNODE_EGRESS_MEASURE_BYTES ?? 512 * 1024 * 1024);

const pct = (xs: number[], p: number) => [...xs].sort((a, b) => a - b)[Math.min(xs.length - 1, Math.floor((p / 100) * xs.length))]!;

describeWith('egress proxy measurement', [PARTS.root, NFT, ON], () => {
  let fx: EgressFixture;
  beforeAll(async () => {
    fx = await startEgressFixture();
    fx.setPolicy({ allowOut: ['allowed.test'], blockAll: true });
  });
  afterAll(async () => {
    await fx?.stop();
  });

  it('prints throughput and latency, direct vs through the proxy', async () => {
    const resolve = ['--resolve', `allowed.test:80:${fx.internet.address}`];
    const urls = Array.from({ length: N }, (_, i) => `http://allowed.test/r${i}`);
    const latencyArgs = ['-sS', ...resolve, '-H', 'Connection: close', '-w', '%{time_total}\n', ...urls.flatMap((u) => ['-o', '/dev/null', u])];
    const tputArgs = ['-sS', ...resolve, '-o', '/dev/null', '-w', '%{speed_download}\n', `http://allowed.test/bytes/${SIZE}`];
    const host = async (args: string[]) => (await run('curl', args, { maxBuffer: 1 << 24 })).stdout;
    const sandbox = async (args: string[]) => {
      const r = await fx.inSandbox(['curl', ...args], 280_000);
      if (r.code !== 0) throw new Error(`curl in sandbox failed: ${r.stderr}`);
      return r.stdout;
    };
    const lat = (out: string) =>
      out
        .trim()
        .split('\n')
        .map((s) => Number(s) * 1000);
    const rows: string[] = [];
    for (const round of [1, 2]) {
      const d = lat(await host(latencyArgs));
      const p = lat(await sandbox(latencyArgs));
      const dt = Number((await host(tputArgs)).trim()) / 1e6;
      const c0 = process.cpuUsage();
      const pt = Number((await sandbox(tputArgs)).trim()) / 1e6;
      const c = process.cpuUsage(c0); // this process is the proxy (curl and the test internet are children)
      const cpuMsPerMiB = (c.user + c.system) / 1000 / (SIZE / 1048576);
      rows.push(
        `round ${round}: latency p50 direct ${pct(d, 50).toFixed(3)} ms, proxied ${pct(p, 50).toFixed(3)} ms (+${(pct(p, 50) - pct(d, 50)).toFixed(3)} ms); ` +
          `p99 direct ${pct(d, 99).toFixed(3)} ms, proxied ${pct(p, 99).toFixed(3)} ms; ` +
          `throughput direct ${dt.toFixed(0)} MB/s, proxied ${pt.toFixed(0)} MB/s (${((pt / dt) * 100).toFixed(0)}%); proxy CPU ${cpuMsPerMiB.toFixed(3)} ms/MiB`,
      );
    }
    const t = fx.proxy.traffic(`sb-${fx.netns.slice(4, 10)}`)!;
    rows.push(`proxy counters: ${t.connections} connections, ${t.refused} refused, ${t.bytesIn} bytes in, ${t.bytesOut} bytes out`);
    process.stderr.write(`\negress measurement (N=${N} requests, ${SIZE} bytes):\n${rows.join('\n')}\n`);
    expect(t.bytesIn).toBeGreaterThanOrEqual(2 * SIZE); // the proxied downloads went through the proxy
  });
});
