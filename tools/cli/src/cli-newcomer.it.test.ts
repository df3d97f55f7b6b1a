/**
 * Newcomer findings on the CLI walkthrough of README.md, each fixed:
 * - `sandbox cp sb-ID:FILE ./local` wrote the file 0600 whatever its mode in the sandbox, while
 *   a directory download kept modes; now a file keeps its permission bits.
 * - a download cut by Ctrl-C (SIGINT) or SIGTERM left `.NAME.sandnode-download-XXXX` (the bytes
 *   so far) beside the target, one more per cut; now nothing is left (README: "leaves nothing
 *   when cut").
 * - `template list --json` printed ts-proto's internal `"_unknownFields": {}`.
 * - daemon log lines carried a key twice ("pid": the daemon's and the sandbox's; "component":
 *   "server" and "warm-pool"), so `jq .pid` gave the wrong one.
 * - `sandbox create --json`'s network object (proto JSON) left `slot` out when it was 0.
 * - `sandbox exec` of a missing command exited 1, like a command's own exit 1; now 127.
 */
import { spawn } from 'node:child_process';
import { mkdtempSync, readFileSync, readdirSync, rmSync, statSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { describeNode, startNode, type TestNode } from '@sandnode/testkit';

jest.setTimeout(180_000);

describeNode('sandnode CLI walkthrough (newcomer findings)', () => {
  let node: TestNode;
  let dir: string;
  let id: string;
  beforeAll(async () => {
    node = await startNode({ network: true });
    dir = mkdtempSync(path.join(os.tmpdir(), 'sandnode-cli-newcomer-'));
    const c = node.cli(['sandbox', 'create', '--template', 'base', '--json']);
    expect(c.status).toBe(0);
    id = (JSON.parse(c.stdout) as { id: string }).id;
  });
  afterAll(async () => {
    if (id) node.cli(['sandbox', 'delete', id, '--if-exists']);
    if (dir) rmSync(dir, { recursive: true, force: true });
    await node?.stop();
  });

  it('a single-file download keeps the mode the file has in the sandbox, like a directory download and an upload', () => {
    const src = path.join(dir, 'run.sh');
    writeFileSync(src, '#!/bin/sh\necho run\n', { mode: 0o755 });
    expect(node.cli(['sandbox', 'cp', src, `${id}:run.sh`]).status).toBe(0);
    expect(node.cli(['sandbox', 'exec', id, '--', 'stat', '-c', '%a', '/workspace/run.sh']).stdout.trim()).toBe('755');
    const back = path.join(dir, 'back.sh');
    expect(node.cli(['sandbox', 'cp', `${id}:run.sh`, back]).status).toBe(0);
    expect((statSync(back).mode & 0o777).toString(8)).toBe('755');
  });

  it('sandbox create --json: the network object always has its slot (0 too)', () => {
    const c = node.cli(['sandbox', 'create', '--template', 'base', '--json']);
    expect(c.status).toBe(0);
    const s = JSON.parse(c.stdout) as { id: string; network: Record<string, unknown> };
    node.cli(['sandbox', 'delete', s.id]);
    expect(typeof s.network.slot).toBe('number');
  });

  it('a plain download cut by SIGINT leaves nothing beside the target (README: "leaves nothing when cut")', async () => {
    // 256 MiB in the sandbox, so the copy runs long enough to be cut in the middle
    expect(node.cli(['sandbox', 'exec', id, '--', 'sh', '-c', 'head -c 268435456 /dev/urandom > /workspace/big.bin']).status).toBe(0);
    const out = mkdtempSync(path.join(dir, 'dl-'));
    const p = spawn(
      process.execPath,
      [require.resolve('@sandnode/cli/dist/main.js'), '--state-dir', node.dirs.stateDir, '--run-dir', node.dirs.runDir, '--listen', '', 'sandbox', 'cp', `${id}:big.bin`, path.join(out, 'big.bin')],
      { stdio: 'ignore' },
    );
    const exited = new Promise<number | null>((resolve) => p.on('exit', (code) => resolve(code)));
    // wait until some bytes have arrived, then cut it like Ctrl-C does
    for (let i = 0; i < 200 && readdirSync(out).every((f) => statSync(path.join(out, f)).size < 1 << 20); i++) await new Promise((r) => setTimeout(r, 25));
    p.kill('SIGINT');
    expect(await exited).not.toBe(0);
    await new Promise((r) => setTimeout(r, 500));
    expect(readdirSync(out)).toEqual([]);
  });

  it('exec of a command the sandbox does not have exits 127 (as sh and docker exec), its own exit 1 stays 1', () => {
    const missing = node.cli(['sandbox', 'exec', id, '--', '/nonexistent']);
    expect({ status: missing.status, stderr: missing.stderr }).toEqual({ status: 127, stderr: expect.stringContaining('NOT_FOUND: argv[0]: /nonexistent: command not found') });
    expect(node.cli(['sandbox', 'exec', id, '--', 'sh', '-c', 'exit 1']).status).toBe(1);
  });

  it('template list --json shows no ts-proto internals (_unknownFields)', () => {
    const r = node.cli(['template', 'list', '--json']);
    expect(r.status).toBe(0);
    expect(r.stdout).not.toContain('_unknownFields');
  });

  it('no daemon log line has a key twice at its top level', () => {
    const created = node.cli(['sandbox', 'create', '--template', 'base', '--json']);
    expect(created.status).toBe(0);
    node.cli(['sandbox', 'delete', (JSON.parse(created.stdout) as { id: string }).id]);
    const dupes: string[] = [];
    for (const f of readdirSync(path.join(node.dirs.runDir, 'logs'))) {
      for (const line of readFileSync(path.join(node.dirs.runDir, 'logs', f), 'utf8').split('\n')) {
        if (!line.startsWith('{')) continue;
        // top-level keys: a reviver sees them with this === the root object
        const seen = new Map<string, number>();
        const keys = [...line.matchAll(/[{,]"([A-Za-z_]+)":/g)].map((m) => m[1]!);
        const root = JSON.parse(line) as Record<string, unknown>;
        for (const k of keys) if (k in root) seen.set(k, (seen.get(k) ?? 0) + 1);
        for (const [k, n] of seen) if (n > 1 && (k === 'pid' || k === 'component')) dupes.push(`${f}: ${k} x${n}: ${String(root.msg)}`);
      }
    }
    expect(dupes).toEqual([]);
  });
});
