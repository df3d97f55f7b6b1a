/**
 * The bulk channel of `sandbox cp` through a whole node (issue 15 §1, Files; rpc/bulk-transfer.ts,
 * podd core/file-bulk.ts): a copy in and out over the channel ("via": "bulk") with equal
 * sha256 and the server's CPU time far below the bytes moved; a token used twice, presented by
 * another process, or after its expiry is refused; the gRPC streams still work beside it
 * (SANDNODE_CP_GRPC=1, the fallback the CLI takes when a server or podd lacks the feature).
 */
import { spawn } from 'node:child_process';
import net from 'node:net';
import { createHash, randomBytes } from 'node:crypto';
import { createReadStream, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { askVersion, BULK_MAGIC, Status } from '@sandnode/shared';
import { BulkDirection } from '@sandnode/shared/proto/server/v1/files';
import { describeNode, execCollect, startNode, waitFor, type TestNode } from '@sandnode/testkit';
import { SandboxState } from '@sandnode/shared/proto/server/v1/sandbox';
import { usocket } from './usock';

jest.setTimeout(900_000);

const MiB = 1024 * 1024;

async function sha256Of(file: string): Promise<string> {
  const h = createHash('sha256');
  for await (const c of createReadStream(file)) h.update(c as Buffer);
  return h.digest('hex');
}

describeNode('sandbox cp over the bulk channel (server.files.bulk.v1)', () => {
  let node: TestNode;
  let id: string;
  let tmp: string;

  function cli(args: string[], env: Record<string, string> = {}): Promise<{ status: number | null; stdout: string; stderr: string }> {
    const p = spawn(process.execPath, [require.resolve('@sandnode/cli/dist/main.js'), '--state-dir', node.dirs.stateDir, '--run-dir', node.dirs.runDir, '--listen', '', ...args], {
      stdio: ['ignore', 'pipe', 'pipe'],
      env: { ...process.env, ...env },
    });
    let stdout = '';
    let stderr = '';
    p.stdout.on('data', (d: Buffer) => (stdout += d.toString()));
    p.stderr.on('data', (d: Buffer) => (stderr += d.toString()));
    return new Promise((resolve) => p.on('close', (status) => resolve({ status, stdout, stderr })));
  }

  /** present sends token on a bulk connection to the server: "fd" when a connection was passed, else the error line's code. */
  function present(token: string): Promise<number | 'fd'> {
    return new Promise((resolve, reject) => {
      const u = new usocket.USocket();
      let text = '';
      u.on('error', reject);
      u.on('end', () => resolve((JSON.parse(text) as { error: { code: number } }).error.code));
      u.connect(`${node.dirs.runDir}/server.sock`, () => {
        u.on('readable', () => {
          const got = u.read(1, 1);
          if (got?.fds?.length) {
            u.removeAllListeners('readable');
            for (const fd of got.fds) require('node:fs').closeSync(fd);
            setImmediate(() => u.destroy());
            resolve('fd');
            return;
          }
          const b = u.read();
          if (b) text += b.toString();
        });
        u.write(Buffer.concat([BULK_MAGIC, Buffer.from(`${token}\n`)]));
      });
    });
  }

  const prepare = async () =>
    (await node.api.sandboxes.prepareBulkTransfer({ sandboxId: id, path: 'tok.bin', direction: BulkDirection.BULK_DIRECTION_DOWNLOAD, offset: 0, mode: 0, inPlace: false, sizeBytes: 0 })).token;

  beforeAll(async () => {
    node = await startNode();
    id = (await node.api.sandboxes.createSandbox({ template: 'base' })).sandbox!.sandboxId;
    tmp = mkdtempSync(path.join(os.tmpdir(), 'sandnode-bulk-it-'));
    await execCollect(node.api, id, ['sh', '-c', 'echo hi > /workspace/tok.bin']);
  });
  afterAll(async () => {
    await node?.stop();
    if (tmp) rmSync(tmp, { recursive: true, force: true });
  });

  it('moves 128 MiB in and out over the bulk channel with the sha256 intact, the server copying none of it', async () => {
    const src = path.join(tmp, 'in.bin');
    const data = randomBytes(128 * MiB);
    writeFileSync(src, data);
    const sha = createHash('sha256').update(data).digest('hex');
    const serverPid = (await askVersion(`unix://${node.dirs.runDir}/server.sock`)).pid;
    const cpu = () => {
      const f = require('node:fs').readFileSync(`/proc/${serverPid}/stat`, 'utf8').split(') ')[1].split(' ');
      return (Number(f[11]) + Number(f[12])) * 10;
    };
    const c0 = cpu();
    const up = await cli(['sandbox', 'cp', src, `${id}:/workspace/in.bin`, '--json']);
    expect(up.stderr).toBe('');
    expect(JSON.parse(up.stdout)).toMatchObject({ bytes: 128 * MiB, sha256: sha, via: 'bulk' });
    const back = path.join(tmp, 'back.bin');
    const down = await cli(['sandbox', 'cp', `${id}:in.bin`, back, '--json']);
    expect(down.status).toBe(0);
    expect(JSON.parse(down.stdout)).toMatchObject({ bytes: 128 * MiB, sha256: sha, via: 'bulk' });
    expect(await sha256Of(back)).toBe(sha);
    // the gRPC streams cost the server about 2.5 s per GiB (0.3 s here); the channel a few calls
    expect(cpu() - c0).toBeLessThan(250);
    expect((await execCollect(node.api, id, ['ls', '-a', '/workspace'])).stdout).not.toMatch(/sandnode-upload/);
  });

  it('the gRPC streams still move the file (the fallback path)', async () => {
    const src = path.join(tmp, 'small.bin');
    writeFileSync(src, randomBytes(3 * MiB + 7));
    const sha = await sha256Of(src);
    const up = await cli(['sandbox', 'cp', src, `${id}:/workspace/small.bin`, '--json'], { SANDNODE_CP_GRPC: '1' });
    expect(JSON.parse(up.stdout)).toMatchObject({ sha256: sha, via: 'grpc' });
    const down = await cli(['sandbox', 'cp', `${id}:small.bin`, path.join(tmp, 'small.back'), '--json'], { SANDNODE_CP_GRPC: '1' });
    expect(JSON.parse(down.stdout)).toMatchObject({ sha256: sha, via: 'grpc' });
  });

  it('a token works once, only for the process it was issued to', async () => {
    const token = await prepare();
    expect(await present(token)).toBe('fd');
    expect(await present(token)).toBe(Status.UNAUTHENTICATED);
    // another process (same uid, other pid) presents a fresh token: refused, and the token is used up
    const other = await prepare();
    const child = spawn(process.execPath, [
      '-e',
      `const s = require('node:net').connect(${JSON.stringify(`${node.dirs.runDir}/server.sock`)});
       s.on('connect', () => s.write('SNBULK1\\n' + ${JSON.stringify(other)} + '\\n'));
       let d = ''; s.on('data', (b) => (d += b)); s.on('close', () => process.stdout.write(d));`,
    ]);
    let out = '';
    child.stdout.on('data', (b: Buffer) => (out += b.toString()));
    await new Promise((r) => child.on('close', r));
    expect((JSON.parse(out) as { error: { code: number } }).error.code).toBe(Status.PERMISSION_DENIED);
    expect(await present(other)).toBe(Status.UNAUTHENTICATED);
    expect(await present('not-a-token')).toBe(Status.UNAUTHENTICATED);
  });

  it('a bulk download the caller holds open keeps its sandbox from being paused idle (the server sees none of its bytes); once it ends, the pause comes', async () => {
    const sb = (await node.api.sandboxes.createSandbox({ template: 'base', idle: { pauseAfterS: 1, hibernateAfterS: 0, pausedTtlS: 0 } })).sandbox!.sandboxId;
    try {
      const made = await execCollect(node.api, sb, ['sh', '-c', 'dd if=/dev/urandom of=/workspace/held.bin bs=1M count=48 2>/dev/null && sha256sum /workspace/held.bin']);
      expect(made.exitCode).toBe(0);
      const want = made.stdout.split(' ')[0];
      const token = (
        await node.api.sandboxes.prepareBulkTransfer({ sandboxId: sb, path: 'held.bin', direction: BulkDirection.BULK_DIRECTION_DOWNLOAD, offset: 0, mode: 0, inPlace: false, sizeBytes: 0 })
      ).token;
      const fd = await new Promise<number>((resolve, reject) => {
        const u = new usocket.USocket();
        u.on('error', reject);
        u.connect(`${node.dirs.runDir}/server.sock`, () => {
          u.on('readable', () => {
            const got = u.read(1, 1);
            if (got?.fds?.length) {
              u.removeAllListeners('readable');
              setImmediate(() => u.destroy());
              resolve(got.fds[0]!);
            }
          });
          u.write(Buffer.concat([BULK_MAGIC, Buffer.from(`${token}\n`)]));
        });
      });
      const podd = new net.Socket({ fd, readable: true, writable: true });
      podd.pause();
      // the transfer is held: 48 MiB do not fit the socket buffers; pause_after_s (1 s) and several reaper ticks pass
      await new Promise((r) => setTimeout(r, 4000));
      expect((await node.api.sandboxes.getSandbox({ sandboxId: sb })).sandbox!.state).toBe(SandboxState.SANDBOX_STATE_RUNNING);
      const h = createHash('sha256');
      let head = Buffer.alloc(0);
      let headDone = false;
      podd.on('data', (d: Buffer) => {
        if (headDone) return void h.update(d);
        head = Buffer.concat([head, d]);
        const nl = head.indexOf(10);
        if (nl < 0) return;
        headDone = true;
        expect(JSON.parse(head.subarray(0, nl).toString())).toEqual({ sizeBytes: 48 * MiB });
        h.update(head.subarray(nl + 1));
      });
      podd.resume();
      await new Promise((r) => podd.on('close', r));
      expect(h.digest('hex')).toBe(want);
      await waitFor('the idle pause after the transfer ended', async () => (await node.api.sandboxes.getSandbox({ sandboxId: sb })).sandbox!.state === SandboxState.SANDBOX_STATE_PAUSED, 15_000, 200);
    } finally {
      await node.api.sandboxes.deleteSandbox({ sandboxId: sb }).catch(() => undefined);
    }
  });

  it('an expired token is refused', async () => {
    const token = await prepare();
    await new Promise((r) => setTimeout(r, 10_500));
    expect(await present(token)).toBe(Status.UNAUTHENTICATED);
  });

  it('gRPC still works on the same socket next to bulk connections, and bad requests change nothing', async () => {
    await expect(
      node.api.sandboxes.prepareBulkTransfer({ sandboxId: id, path: '../etc/passwd', direction: BulkDirection.BULK_DIRECTION_UPLOAD, offset: 0, mode: 0, inPlace: false, sizeBytes: 1 }),
    ).rejects.toMatchObject({ code: Status.INVALID_ARGUMENT });
    await expect(
      node.api.sandboxes.prepareBulkTransfer({ sandboxId: id, path: 'x', direction: BulkDirection.BULK_DIRECTION_UNSPECIFIED, offset: 0, mode: 0, inPlace: false, sizeBytes: 1 }),
    ).rejects.toMatchObject({ code: Status.INVALID_ARGUMENT });
    expect((await node.api.sandboxes.getSandbox({ sandboxId: id })).sandbox?.sandboxId).toBe(id);
  });
});
