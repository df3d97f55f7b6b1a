/**
 * Attacker findings (fixed): `sandbox cp SB:PATH LOCAL` against a real node.
 *  (a) over gRPC (SANDNODE_CP_GRPC=1, as over TCP) a file truncated in the sandbox while it is
 *      read made podd end the stream early and the CLI committed the short file with success.
 *  (b) a CLI killed with SIGKILL mid-download left its hidden temp file (as large as what had
 *      arrived) for good; the next copy of the same name now removes the temp files of CLIs
 *      that are gone.
 */
import { spawn, spawnSync } from 'node:child_process';
import { mkdtempSync, readdirSync, rmSync, statSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { describeNode, execCollect, startNode, waitFor, type TestNode } from '@sandnode/testkit';

jest.setTimeout(240_000);

const CLI = require.resolve('@sandnode/cli/dist/main.js');
const SIZE = 100_000_000;

describeNode('sandbox cp download under attack', () => {
  let node: TestNode;
  let id: string;
  let tmp: string;
  const cliArgs = () => [CLI, '--state-dir', node.dirs.stateDir, '--run-dir', node.dirs.runDir, '--listen', ''];

  beforeAll(async () => {
    node = await startNode();
    id = (await node.api.sandboxes.createSandbox({ template: 'base' })).sandbox!.sandboxId;
    tmp = mkdtempSync(path.join(os.tmpdir(), 'attacker-cp-'));
  });
  afterAll(async () => {
    await node?.stop();
    if (tmp) rmSync(tmp, { recursive: true, force: true });
  });

  it('(a) over gRPC a file cut short while it is read is not committed', async () => {
    expect((await execCollect(node.api, id, ['sh', '-c', `head -c ${SIZE} /dev/zero > /workspace/f`])).exitCode).toBe(0);
    const dst = path.join(tmp, 'a');
    const child = spawn(process.execPath, [...cliArgs(), 'sandbox', 'cp', `${id}:/workspace/f`, dst], { env: { ...process.env, SANDNODE_CP_GRPC: '1' }, stdio: ['ignore', 'pipe', 'pipe'] });
    let stderr = '';
    child.stderr.on('data', (b: Buffer) => (stderr += b.toString()));
    // truncate once the copy is under way (a temp file beside dst has bytes)
    await waitFor('the download to start', () => readdirSync(tmp).some((n) => n.startsWith('.a.') && statSync(path.join(tmp, n)).size > 0) || undefined, 60_000, 5);
    await execCollect(node.api, id, ['truncate', '-s', '1000', '/workspace/f']);
    const code = await new Promise<number | null>((r) => child.on('close', r));
    const kept = readdirSync(tmp).filter((n) => n === 'a');
    // either the copy finished before the truncate (the whole file) or it must fail and keep nothing
    if (kept.length) expect(statSync(dst).size).toBe(SIZE);
    else expect(code).not.toBe(0);
    if (code === 0) expect(statSync(dst).size).toBe(SIZE);
    void stderr;
  });

  it('(b) a download killed with SIGKILL leaves no temp file once the next copy ran', async () => {
    expect((await execCollect(node.api, id, ['sh', '-c', `head -c ${SIZE} /dev/urandom > /workspace/g`])).exitCode).toBe(0);
    const dst = path.join(tmp, 'g');
    const child = spawn(process.execPath, [...cliArgs(), 'sandbox', 'cp', `${id}:/workspace/g`, dst], { stdio: 'ignore' });
    await waitFor('the download to start', () => readdirSync(tmp).some((n) => n.startsWith('.g.') && statSync(path.join(tmp, n)).size > 0) || undefined, 60_000, 5);
    child.kill('SIGKILL');
    await new Promise((r) => child.on('close', r));
    const again = spawnSync(process.execPath, [...cliArgs(), 'sandbox', 'cp', `${id}:/workspace/g`, dst], { encoding: 'utf8' });
    expect(again.status).toBe(0);
    expect(readdirSync(tmp).filter((n) => n.startsWith('.g.'))).toEqual([]);
  });
});
