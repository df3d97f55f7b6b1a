/**
 * Streamed files through a whole node (issue 15 §1, Files): `sandnode sandbox cp` of 256 MiB
 * in and out with equal sha256, a copy cut halfway (the CLI killed) resumed at its offset, a
 * download from an offset, a 10k-entry directory listed in pages, a sandbox that swaps a
 * directory for a symlink to / while files stream, bad paths, a deadline mid-upload (no temp
 * file left), a paused sandbox, and `exec --stdin` above its limit.
 */
import { spawn } from 'node:child_process';
import { createHash, randomBytes } from 'node:crypto';
import { createReadStream, createWriteStream, mkdtempSync, rmSync, statSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { Status } from 'nice-grpc-common';
import type { ServerApi } from '@sandnode/shared';
import { FileType, type UploadFileRequest } from '@sandnode/shared/proto/server/v1/files';
import { describeNode, execCollect, expectCode, startNode, waitFor, type TestNode } from '@sandnode/testkit';

jest.setTimeout(900_000);

const MiB = 1024 * 1024;
const BIG = 256 * MiB;

async function sh(api: ServerApi, id: string, script: string): Promise<string> {
  const r = await execCollect(api, id, ['sh', '-c', script]);
  if (r.exitCode !== 0) throw new Error(`${script}: exit ${r.exitCode}: ${r.stderr}`);
  return r.stdout;
}

/** writeRandom writes n random bytes to file and returns their sha256. */
async function writeRandom(file: string, n: number): Promise<string> {
  const h = createHash('sha256');
  const out = createWriteStream(file);
  for (let done = 0; done < n;) {
    const b = randomBytes(Math.min(4 * MiB, n - done));
    h.update(b);
    if (!out.write(b)) await new Promise<void>((r) => out.once('drain', () => r()));
    done += b.length;
  }
  await new Promise<void>((resolve, reject) => out.end((err?: Error | null) => (err ? reject(err) : resolve())));
  return h.digest('hex');
}

async function sha256Of(file: string): Promise<string> {
  const h = createHash('sha256');
  for await (const c of createReadStream(file)) h.update(c as Buffer);
  return h.digest('hex');
}

describeNode('streamed files through the node (UploadFile / DownloadFile / ListDirectory / StatFile, sandbox cp)', () => {
  let node: TestNode;
  let id: string;
  let tmp: string;
  let bigFile: string;
  let bigSha: string;

  /** cli runs the CLI without blocking the test's event loop; kill() ends it. */
  function cli(args: string[]): { done: Promise<{ status: number | null; stdout: string; stderr: string }>; kill: () => void } {
    const p = spawn(process.execPath, [require.resolve('@sandnode/cli/dist/main.js'), '--state-dir', node.dirs.stateDir, '--run-dir', node.dirs.runDir, '--listen', '', ...args], {
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    let stdout = '';
    let stderr = '';
    p.stdout.on('data', (d: Buffer) => (stdout += d.toString()));
    p.stderr.on('data', (d: Buffer) => (stderr += d.toString()));
    const done = new Promise<{ status: number | null; stdout: string; stderr: string }>((resolve) => p.on('close', (status) => resolve({ status, stdout, stderr })));
    return { done, kill: () => p.kill('SIGKILL') };
  }

  beforeAll(async () => {
    node = await startNode();
    id = (await node.api.sandboxes.createSandbox({ template: 'base' })).sandbox!.sandboxId;
    tmp = mkdtempSync(path.join(os.tmpdir(), 'sandnode-files-'));
    bigFile = path.join(tmp, 'big.bin');
    bigSha = await writeRandom(bigFile, BIG);
  });
  afterAll(async () => {
    await node?.stop();
    if (tmp) rmSync(tmp, { recursive: true, force: true });
  });

  it('sandbox cp moves 256 MiB in and out with the sha256 intact', async () => {
    const up = await cli(['sandbox', 'cp', bigFile, `${id}:/workspace/big.bin`, '--json']).done;
    expect(up.stderr).toBe('');
    expect(up.status).toBe(0);
    const u = JSON.parse(up.stdout) as { bytes: number; sha256: string; offset: number };
    expect(u).toMatchObject({ bytes: BIG, sha256: bigSha, offset: 0 });
    expect((await sh(node.api, id, 'stat -c %s /workspace/big.bin')).trim()).toBe(String(BIG));
    expect(await sh(node.api, id, 'ls -a /workspace')).not.toMatch(/sandnode-upload/);

    const back = path.join(tmp, 'back.bin');
    const down = await cli(['sandbox', 'cp', `${id}:big.bin`, back, '--json']).done;
    expect(down.status).toBe(0);
    expect(JSON.parse(down.stdout)).toMatchObject({ bytes: BIG, sha256: bigSha });
    expect(await sha256Of(back)).toBe(bigSha);
    rmSync(back);

    const st = (await node.api.sandboxes.statFile({ sandboxId: id, path: 'big.bin' })).info!;
    expect(st).toMatchObject({ name: 'big.bin', type: FileType.FILE_TYPE_REGULAR, sizeBytes: BIG });
  });

  it('a download from an offset returns the file from there', async () => {
    const at = 100 * MiB + 12345;
    let got = 0;
    const h = createHash('sha256');
    let first = true;
    for await (const m of node.api.sandboxes.downloadFile({ sandboxId: id, path: '/workspace/big.bin', offset: at })) {
      if (first) {
        expect(m.sizeBytes).toBe(BIG);
        first = false;
      }
      expect(m.offset).toBe(at + got);
      h.update(m.data);
      got += m.data.length;
    }
    expect(got).toBe(BIG - at);
    const want = createHash('sha256');
    for await (const c of createReadStream(bigFile, { start: at })) want.update(c as Buffer);
    expect(h.digest('hex')).toBe(want.digest('hex'));
  });

  it('an upload cut halfway (the CLI killed) resumes at its offset with --resume', async () => {
    const dest = `${id}:/workspace/resumed.bin`;
    const run = cli(['sandbox', 'cp', '--resume', bigFile, dest, '--json']);
    let ended = false;
    void run.done.then(() => (ended = true));
    await waitFor(
      'a third of the upload (or the CLI to end)',
      async () => {
        const info = await node.api.sandboxes.statFile({ sandboxId: id, path: 'resumed.bin' }).catch(() => undefined);
        return ended || (info?.info?.sizeBytes ?? 0) >= BIG / 3 || undefined;
      },
      300_000,
      20,
    );
    expect(ended).toBe(false);
    run.kill();
    const killed = await run.done;
    expect(killed.status).toBeNull(); // killed, not finished
    const cut = await waitFor('podd to end the cut upload', async () => {
      const a = (await node.api.sandboxes.statFile({ sandboxId: id, path: 'resumed.bin' })).info!.sizeBytes;
      await new Promise((r) => setTimeout(r, 300));
      const b = (await node.api.sandboxes.statFile({ sandboxId: id, path: 'resumed.bin' })).info!.sizeBytes;
      return a === b ? b : undefined;
    });
    expect(cut).toBeGreaterThan(0);
    expect(cut).toBeLessThan(BIG);
    const again = await cli(['sandbox', 'cp', '--resume', bigFile, dest, '--json']).done;
    expect(again.status).toBe(0);
    const r = JSON.parse(again.stdout) as { offset: number; bytes: number; bytesSent: number; sha256: string };
    expect(r.offset).toBe(cut);
    expect(r).toMatchObject({ bytes: BIG, bytesSent: BIG - cut, sha256: bigSha });
    const back = path.join(tmp, 'resumed.bin');
    expect((await cli(['sandbox', 'cp', `${id}:resumed.bin`, back]).done).status).toBe(0);
    expect(await sha256Of(back)).toBe(bigSha);
    rmSync(back);
    await sh(node.api, id, 'rm -f /workspace/resumed.bin /workspace/big.bin');
  });

  it('a download cut short continues with cp --resume from the bytes the local file has', async () => {
    const small = path.join(tmp, 'small.bin');
    const sha = await writeRandom(small, 5 * MiB + 333);
    expect((await cli(['sandbox', 'cp', small, `${id}:small.bin`]).done).status).toBe(0);
    const part = path.join(tmp, 'part.bin');
    // the first 2 MiB, as a cut download leaves them
    const h = createWriteStream(part);
    for await (const c of createReadStream(small, { end: 2 * MiB - 1 })) h.write(c as Buffer);
    await new Promise<void>((r) => h.end(() => r()));
    const r = await cli(['sandbox', 'cp', '--resume', `${id}:small.bin`, part, '--json']).done;
    expect({ status: r.status, stderr: r.stderr }).toEqual({ status: 0, stderr: '' });
    expect(JSON.parse(r.stdout)).toMatchObject({ offset: 2 * MiB, bytes: 5 * MiB + 333, bytesSent: 3 * MiB + 333, sha256: sha });
    expect(await sha256Of(part)).toBe(sha);
  });

  it('a directory of 10,000 entries is listed in bounded, ordered pages', async () => {
    await sh(node.api, id, 'mkdir -p /workspace/many && cd /workspace/many && i=0; while [ $i -lt 10000 ]; do : > "f$i"; i=$((i+1)); done; ln -s / link');
    const names: string[] = [];
    let token = '';
    let pages = 0;
    do {
      const page = await node.api.sandboxes.listDirectory({ sandboxId: id, path: 'many', pageSize: 1000, pageToken: token });
      expect(page.entries.length).toBeLessThanOrEqual(1000);
      names.push(...page.entries.map((e) => e.name));
      token = page.nextPageToken;
      pages++;
    } while (token);
    expect(pages).toBe(11);
    expect(names.length).toBe(10001);
    expect(new Set(names).size).toBe(10001);
    expect(names).toEqual([...names].sort((a, b) => Buffer.compare(Buffer.from(a), Buffer.from(b))));
    const link = await node.api.sandboxes.statFile({ sandboxId: id, path: 'many/link' });
    expect(link.info!.type).toBe(FileType.FILE_TYPE_SYMLINK);
    await expectCode(node.api.sandboxes.listDirectory({ sandboxId: id, path: 'many', pageSize: 1001 }), Status.INVALID_ARGUMENT, /page_size/);
    await expectCode(node.api.sandboxes.listDirectory({ sandboxId: id, path: 'many/link' }), Status.FAILED_PRECONDITION);
    const ls = await cli(['sandbox', 'ls', id, 'many', '--json']).done;
    expect(ls.status).toBe(0);
    expect((JSON.parse(ls.stdout) as { entries: unknown[] }).entries.length).toBe(10001);
    await sh(node.api, id, 'rm -rf /workspace/many');
  });

  it('a sandbox swapping a directory for a symlink to / while files stream never makes podd read or write outside /workspace', async () => {
    await sh(node.api, id, 'mkdir -p /workspace/d && echo inside > /workspace/d/secret && echo OUTSIDE > /secret && rm -f /up* /tmp/stop-race');
    const race = execCollect(node.api, id, ['sh', '-c', 'cd /workspace; while [ ! -e /tmp/stop-race ]; do mv d d.real; ln -s / d; rm d; mv d.real d; done'], { timeoutMs: 600_000 });
    const seen = new Map<string, number>();
    const count = (k: string) => seen.set(k, (seen.get(k) ?? 0) + 1);
    try {
      for (let i = 0; i < 150; i++) {
        try {
          const parts: Buffer[] = [];
          for await (const m of node.api.sandboxes.downloadFile({ sandboxId: id, path: 'd/secret' })) parts.push(m.data);
          count(Buffer.concat(parts).toString().trim());
        } catch (err) {
          count(Status[(err as { code: Status }).code] ?? 'error');
        }
        async function* up(): AsyncIterable<UploadFileRequest> {
          yield { part: { $case: 'header', value: { sandboxId: id, path: i % 2 ? 'd/secret' : `d/up${i}`, offset: 0, mode: 0, inPlace: i % 4 === 1 } } };
          yield { part: { $case: 'data', value: Buffer.from('WRITTEN') } };
          yield { part: { $case: 'end', value: { sha256: '' } } };
        }
        await node.api.sandboxes.uploadFile(up(), { deadline: undefined, retry: false }).catch((err: { code: Status }) => count(`up:${Status[err.code]}`));
        await node.api.sandboxes.listDirectory({ sandboxId: id, path: 'd' }).then(
          (p) => count(p.entries.some((e) => e.name === 'secret' && e.sizeBytes === 'OUTSIDE\n'.length) && p.entries.some((e) => e.name === 'etc') ? 'listed-root' : 'listed'),
          () => count('list-refused'),
        );
      }
    } finally {
      await sh(node.api, id, 'touch /tmp/stop-race');
      await race;
    }
    expect(seen.has('OUTSIDE')).toBe(false);
    expect(seen.has('listed-root')).toBe(false);
    expect((await sh(node.api, id, 'cat /secret')).trim()).toBe('OUTSIDE');
    expect((await sh(node.api, id, 'ls / | grep "^up" || true')).trim()).toBe('');
    // the race did happen both ways: some calls got through, some were refused
    expect([...seen.keys()].some((k) => k === 'inside' || k === 'WRITTEN')).toBe(true);
    expect([...seen.keys()].some((k) => k === 'FAILED_PRECONDITION' || k === 'NOT_FOUND' || k.startsWith('up:'))).toBe(true);
  });

  it('paths with .., NUL or above PATH_MAX are INVALID_ARGUMENT on every call', async () => {
    for (const bad of ['../etc/passwd', 'a/../../etc/passwd', 'a\0b', `${'a/'.repeat(2100)}f`, `/workspace/${'b'.repeat(300)}`, '/etc/passwd']) {
      await expectCode(
        (async () => {
          for await (const _ of node.api.sandboxes.downloadFile({ sandboxId: id, path: bad })) void _;
        })(),
        Status.INVALID_ARGUMENT,
      );
      async function* up(): AsyncIterable<UploadFileRequest> {
        yield { part: { $case: 'header', value: { sandboxId: id, path: bad, offset: 0, mode: 0, inPlace: false } } };
      }
      await expectCode(node.api.sandboxes.uploadFile(up(), { deadline: undefined, retry: false }), Status.INVALID_ARGUMENT);
      await expectCode(node.api.sandboxes.statFile({ sandboxId: id, path: bad }), Status.INVALID_ARGUMENT);
      await expectCode(node.api.sandboxes.listDirectory({ sandboxId: id, path: bad }), Status.INVALID_ARGUMENT);
    }
  });

  it('a deadline that passes mid-upload leaves neither a temp file nor a changed target', async () => {
    await sh(node.api, id, 'echo before > /workspace/target');
    async function* slow(): AsyncIterable<UploadFileRequest> {
      yield { part: { $case: 'header', value: { sandboxId: id, path: 'target', offset: 0, mode: 0, inPlace: false } } };
      for (let i = 0; i < 100; i++) {
        yield { part: { $case: 'data', value: Buffer.alloc(MiB, 7) } };
        await new Promise((r) => setTimeout(r, 100));
      }
    }
    await expectCode(node.api.sandboxes.uploadFile(slow(), { deadline: new Date(Date.now() + 1500), retry: false }), Status.DEADLINE_EXCEEDED);
    await waitFor('the temp file to go', async () => !/sandnode-upload/.test(await sh(node.api, id, 'ls -a /workspace')) || undefined);
    expect((await sh(node.api, id, 'cat /workspace/target')).trim()).toBe('before');
  });

  it('a paused sandbox answers FAILED_PRECONDITION naming its state', async () => {
    const other = (await node.api.sandboxes.createSandbox({ template: 'base' })).sandbox!.sandboxId;
    await node.api.sandboxes.pauseSandbox({ sandboxId: other });
    await expectCode(node.api.sandboxes.statFile({ sandboxId: other, path: 'x' }), Status.FAILED_PRECONDITION, /PAUSED/);
    await expectCode(
      (async () => {
        for await (const _ of node.api.sandboxes.downloadFile({ sandboxId: other, path: 'x' })) void _;
      })(),
      Status.FAILED_PRECONDITION,
      /PAUSED/,
    );
    const r = await cli(['sandbox', 'cp', bigFile, `${other}:/workspace/x`]).done;
    expect(r.status).toBe(1);
    expect(r.stderr).toMatch(/FAILED_PRECONDITION.*PAUSED/);
    await node.api.sandboxes.deleteSandbox({ sandboxId: other });
  });

  it('exec --stdin streams 5 MiB (above the old 3 MiB Exec limit) through ExecStream, every byte', async () => {
    const p = spawn(
      process.execPath,
      [require.resolve('@sandnode/cli/dist/main.js'), '--state-dir', node.dirs.stateDir, '--run-dir', node.dirs.runDir, 'sandbox', 'exec', id, '--stdin', '--', 'wc', '-c'],
      {
        stdio: ['pipe', 'pipe', 'pipe'],
      },
    );
    let stdout = '';
    let stderr = '';
    p.stdout.on('data', (d: Buffer) => (stdout += d.toString()));
    p.stderr.on('data', (d: Buffer) => (stderr += d.toString()));
    p.stdin.end(Buffer.alloc(5 * MiB, 1));
    const status = await new Promise((r) => p.on('close', r));
    expect({ status, stdout: stdout.trim(), stderr }).toEqual({ status: 0, stdout: String(5 * MiB), stderr: '' });
    expect(statSync(bigFile).size).toBe(BIG);
  });
});
