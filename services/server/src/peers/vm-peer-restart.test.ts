/**
 * VmPeer.pause/resume when the vmm-supervisor dies under the call (chaos seed 8, step 57: kill -9
 * of the supervisor 91 ms into a PauseSandbox): the VM was paused, the answer was lost, the
 * server's record stayed RUNNING and the node did not converge. PauseVm is not sent again (it
 * is not idempotent); once the supervisor is back, GetVm decides: a VM in the state asked for is
 * the answer, otherwise the UNAVAILABLE stays. Real gRPC servers (own processes) on a unix socket, the first one
 * killed with SIGKILL inside the handler.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { readFileSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { Status } from '@sandnode/shared';
import { VmState } from '@sandnode/shared/proto/vmm/v1/vmm';
import { useTempDir } from '@sandnode/testkit';
import { VmPeer } from './vm-peer';

/**
 * A stand-in supervisor in its own process: GetVm answers the state in `<sock>.state`; PauseVm /
 * ResumeVm append to `<sock>.calls`, write the new state when APPLIES=1, then SIGKILL the process
 * before answering (a kill -9 mid-call).
 */
const SUPERVISOR = `
const fs = require('fs');
const { createServer } = require('nice-grpc');
const { VmServiceDefinition } = require(process.env.VMM_JS);
const sock = process.env.SOCK;
const server = createServer();
const impl = {};
for (const name of Object.keys(VmServiceDefinition.methods)) impl[name] = async () => ({});
impl.getVm = async (req) => ({ vm: { vmId: req.vmId, state: Number(fs.readFileSync(sock + '.state', 'utf8')), pid: 1 } });
const dies = (to) => async () => {
  fs.appendFileSync(sock + '.calls', 'x');
  if (process.env.APPLIES === '1') fs.writeFileSync(sock + '.state', String(to));
  process.kill(process.pid, 'SIGKILL');
  return new Promise(() => undefined);
};
impl.pauseVm = dies(${VmState.VM_STATE_PAUSED});
impl.resumeVm = dies(${VmState.VM_STATE_RUNNING});
server.add(VmServiceDefinition, impl);
fs.rmSync(sock, { force: true });
server.listen('unix://' + sock).then(() => console.log('up'));
`;

describe('VmPeer.pause/resume when the supervisor dies under the call', () => {
  const tmp = useTempDir('sandnode-vm-peer-restart-');
  let children: ChildProcess[] = [];
  afterEach(() => {
    for (const c of children) c.kill('SIGKILL');
    children = [];
  });

  /** supervisor starts the stand-in at sock and resolves once it listens. */
  async function supervisor(sock: string, applies: boolean): Promise<void> {
    const env = { ...process.env, SOCK: sock, APPLIES: applies ? '1' : '0', VMM_JS: path.resolve(__dirname, '../../../../packages/shared/dist/gen/sandnode/vmm/v1/vmm.js') };
    const child = spawn(process.execPath, ['-e', SUPERVISOR], { env, cwd: path.resolve(__dirname, '../../../..'), stdio: ['ignore', 'pipe', 'inherit'] });
    children.push(child);
    await new Promise((r) => child.stdout!.once('data', r));
  }
  const callsAt = (sock: string) => {
    try {
      return readFileSync(`${sock}.calls`, 'utf8').length;
    } catch {
      return 0;
    }
  };

  it.each([
    ['pause', VmState.VM_STATE_RUNNING, 'PAUSED'],
    ['resume', VmState.VM_STATE_PAUSED, 'RUNNING'],
  ] as const)('%s that took effect: sent once, answered by the VM once the supervisor is back', async (op, from, want) => {
    const sock = path.join(tmp(), `${op}.sock`);
    writeFileSync(`${sock}.state`, String(from));
    await supervisor(sock, true);
    const peer = new VmPeer(`unix://${sock}`, { timeoutMs: 10_000, connectWaitMs: 5000 });
    try {
      const p = peer[op]('sb-1');
      // the supervisor is started again while the call waits for it
      while (callsAt(sock) === 0) await new Promise((r) => setTimeout(r, 5));
      await supervisor(sock, true);
      await expect(p).resolves.toMatchObject({ vmId: 'sb-1', state: want });
      expect(callsAt(sock)).toBe(1);
    } finally {
      peer.close();
    }
  });

  it('a pause that did not take effect: UNAVAILABLE, sent once', async () => {
    const sock = path.join(tmp(), 'none.sock');
    writeFileSync(`${sock}.state`, String(VmState.VM_STATE_RUNNING));
    await supervisor(sock, false);
    const peer = new VmPeer(`unix://${sock}`, { timeoutMs: 10_000, connectWaitMs: 5000 });
    try {
      const p = peer.pause('sb-1').catch((e: unknown) => e);
      while (callsAt(sock) === 0) await new Promise((r) => setTimeout(r, 5));
      await supervisor(sock, false);
      expect(await p).toMatchObject({ code: Status.UNAVAILABLE });
      expect(callsAt(sock)).toBe(1);
    } finally {
      peer.close();
    }
  });
});
