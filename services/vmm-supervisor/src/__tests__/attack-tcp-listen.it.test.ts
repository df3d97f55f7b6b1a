/**
 * Attack (issue 10 §4, as a hostile local user): the vmm-supervisor takes any `listen` address
 * (env SANDNODE_VMM_SUPERVISOR_LISTEN), and main.ts turns its peer check on only for a unix
 * address. Given a TCP one (`127.0.0.1:PORT`, or `0.0.0.0:PORT`: nothing refuses either) it
 * serves the whole VmService, with no credentials, to every process that reaches the port:
 * uid 65534 lists the VMs (and could CreateVm with a host path as a drive or template, run as
 * root). The server refuses the same mistake (a non-loopback `listen` without TLS stops its
 * start; on loopback every call needs a token). Expected: the supervisor refuses to start on a
 * TCP address, or refuses every call on it (no VmService answer for uid 65534).
 */
import { spawn, spawnSync } from 'node:child_process';
import { chmodSync, rmSync, writeFileSync } from 'node:fs';
import net from 'node:net';
import path from 'node:path';
import { describeWith, makeTempDir, waitFor } from '@sandnode/testkit';
import { MAIN_JS, VMM_PARTS } from './fixture';

jest.setTimeout(120_000);

const NOBODY = 65534;

async function freePort(): Promise<number> {
  const s = net.createServer();
  await new Promise<void>((r) => s.listen(0, '127.0.0.1', r));
  const port = (s.address() as net.AddressInfo).port;
  await new Promise((r) => s.close(r));
  return port;
}

describeWith('a vmm-supervisor given a TCP listen address', VMM_PARTS, () => {
  const tmp = makeTempDir('vmm-tcp-listen');
  let proc: ReturnType<typeof spawn> | undefined;
  afterAll(async () => {
    if (proc && proc.exitCode === null) {
      const exited = new Promise((r) => proc!.once('exit', r));
      proc.kill('SIGTERM');
      await exited;
    }
    rmSync(tmp, { recursive: true, force: true });
  });

  it('attack: uid 65534 gets no VmService answer over it (or the supervisor does not start)', async () => {
    const port = await freePort();
    proc = spawn(process.execPath, [MAIN_JS], {
      env: { ...process.env, SANDNODE_VMM_SUPERVISOR_STATE_DIR: path.join(tmp, 'state'), SANDNODE_VMM_SUPERVISOR_RUN_DIR: path.join(tmp, 'run'), SANDNODE_VMM_SUPERVISOR_LISTEN: `127.0.0.1:${port}` },
      stdio: ['ignore', 'ignore', 'ignore'],
    });
    const listening = () =>
      new Promise<boolean>((resolve) => {
        const c = net.connect(port, '127.0.0.1');
        c.once('connect', () => (c.destroy(), resolve(true)));
        c.once('error', () => resolve(false));
      });
    await waitFor('the supervisor to listen or exit', async () => proc!.exitCode !== null || (await listening()), 60_000);
    if (proc.exitCode !== null) return; // refused to start: what the fix may do
    const script = path.join(tmp, 'call.js');
    writeFileSync(
      script,
      `const grpc = require(${JSON.stringify(require.resolve('@grpc/grpc-js'))});
const c = new grpc.Client(process.argv[2], grpc.credentials.createInsecure());
c.makeUnaryRequest('/sandnode.vmm.v1.VmService/ListVms', (b) => b, (b) => b, Buffer.alloc(0), { deadline: Date.now() + 20000 }, (err) => { console.log(err ? err.code + ' ' + err.details : '0 ok'); c.close(); });`,
    );
    chmodSync(tmp, 0o755);
    const r = spawnSync(process.execPath, [script, `127.0.0.1:${port}`], { uid: NOBODY, gid: NOBODY, encoding: 'utf8', timeout: 30_000 });
    expect(r.stdout.trim()).not.toBe('0 ok');
  });
});
