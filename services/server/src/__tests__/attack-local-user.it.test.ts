/**
 * A hostile local user (issue 10 §4): an unprivileged process (uid/gid 65534, nobody, a real
 * child process) against a running node. Its sockets are 0600 root, so a connect is EACCES;
 * and when a socket's mode lets it in anyway (chmod 0666, as a mis-set mode would), the
 * server, its admin socket and the vmm-supervisor answer PERMISSION_DENIED naming uid 65534
 * (peer credentials), and nothing of the service runs. Root is served meanwhile.
 */
import { chmodSync, readdirSync, statSync, writeFileSync } from 'node:fs';
import { spawn } from 'node:child_process';
import path from 'node:path';
import { socketPath, unixAddress } from '@sandnode/shared';
import { adminStatus, describeNode, startNode, type TestNode } from '@sandnode/testkit';
import { Status } from 'nice-grpc-common';

jest.setTimeout(180_000);

const NOBODY = 65534;

/** asNobody runs node script as uid/gid 65534 and resolves its stdout (trimmed). */
function asNobody(script: string, args: string[]): Promise<string> {
  return new Promise((resolve, reject) => {
    const p = spawn(process.execPath, [script, ...args], { uid: NOBODY, gid: NOBODY, stdio: ['ignore', 'pipe', 'pipe'] });
    let out = '';
    let err = '';
    p.stdout.on('data', (d: Buffer) => (out += d.toString()));
    p.stderr.on('data', (d: Buffer) => (err += d.toString()));
    p.on('error', reject);
    p.on('close', (code) => (code === 0 ? resolve(out.trim()) : reject(new Error(`child exited ${code}: ${err}`))));
  });
}

describeNode('a hostile local user against the node sockets', () => {
  let node: TestNode;
  let call: string;
  let connect: string;
  let serverSock: string;
  let adminSock: string;
  let vmmSock: string;
  beforeAll(async () => {
    node = await startNode({ buildTemplate: false });
    const root = path.dirname(node.dirs.runDir);
    // nobody may walk to the sockets: only their own mode (and the peer check) stands in the way
    for (const d of [root, node.dirs.runDir]) chmodSync(d, 0o755);
    serverSock = socketPath(node.dirs.runDir, 'server');
    vmmSock = socketPath(node.dirs.runDir, 'vmm-supervisor');
    const admin = readdirSync(node.dirs.runDir).find((n) => /^server-.*-admin\.sock$/.test(n));
    if (!admin) throw new Error('no admin socket in the run dir');
    adminSock = path.join(node.dirs.runDir, admin);
    call = path.join(root, 'call.js');
    connect = path.join(root, 'connect.js');
    // a raw grpc-js unary call with an empty request: prints "<code> <details>"
    writeFileSync(
      call,
      `const grpc = require(${JSON.stringify(require.resolve('@grpc/grpc-js'))});
const c = new grpc.Client(process.argv[2], grpc.credentials.createInsecure());
c.makeUnaryRequest(process.argv[3], (b) => b, (b) => b, Buffer.alloc(0), { deadline: Date.now() + 20000 }, (err) => { console.log(err ? err.code + ' ' + err.details : '0 ok'); c.close(); });`,
    );
    writeFileSync(connect, `require('net').connect(process.argv[2]).on('connect', function () { console.log('connected'); this.end(); }).on('error', (e) => console.log(e.code));`);
  });
  afterAll(async () => {
    await node?.stop();
  });

  it('cannot connect to server.sock, the admin socket or the vmm-supervisor socket (0600 root: EACCES)', async () => {
    for (const s of [serverSock, adminSock, vmmSock]) expect(await asNobody(connect, [s])).toBe('EACCES');
  });

  it('gets PERMISSION_DENIED naming its uid where a socket mode lets it connect; nothing runs, root is served meanwhile', async () => {
    const before = (await node.api.sandboxes.listSandboxes({})).sandboxes.length;
    const targets: [string, string][] = [
      [serverSock, '/sandnode.server.v1.SandboxService/CreateSandbox'],
      [serverSock, '/sandnode.server.v1.SandboxService/ListSandboxes'],
      [adminSock, '/sandnode.server.v1.AdminService/Drain'],
      [adminSock, '/sandnode.server.v1.AdminService/GetLeaseStatus'],
      [vmmSock, '/sandnode.vmm.v1.VmService/ListVms'],
    ];
    for (const s of [serverSock, adminSock, vmmSock]) chmodSync(s, 0o666);
    try {
      for (const [sock, method] of targets) {
        const out = await asNobody(call, [unixAddress(sock), method]);
        expect(`${method}: ${out}`).toMatch(new RegExp(`^${method}: ${Status.PERMISSION_DENIED} .*uid ${NOBODY}`));
        // root still works at once
        expect((await node.api.sandboxes.listSandboxes({})).sandboxes.length).toBe(before);
      }
    } finally {
      for (const s of [serverSock, adminSock, vmmSock]) chmodSync(s, 0o600);
    }
    expect((await adminStatus(unixAddress(adminSock)))?.epoch).toBeGreaterThan(0);
  });
});

describeNode('server socketGroup: members of the group may call the public socket, nobody else', () => {
  let node: TestNode;
  let call: string;
  let connect: string;
  const GROUP_GID = 65534; // "nogroup" on Debian
  beforeAll(async () => {
    node = await startNode({ buildTemplate: false, env: { server: { SANDNODE_SERVER_SOCKET_GROUP: String(GROUP_GID) } } });
    const root = path.dirname(node.dirs.runDir);
    for (const d of [root, node.dirs.runDir]) chmodSync(d, 0o755);
    call = path.join(root, 'call.js');
    connect = path.join(root, 'connect.js');
    writeFileSync(
      call,
      `const grpc = require(${JSON.stringify(require.resolve('@grpc/grpc-js'))});
const c = new grpc.Client(process.argv[2], grpc.credentials.createInsecure());
c.makeUnaryRequest(process.argv[3], (b) => b, (b) => b, Buffer.alloc(0), { deadline: Date.now() + 20000 }, (err) => { console.log(err ? err.code + ' ' + err.details : '0 ok'); c.close(); });`,
    );
    writeFileSync(connect, `require('net').connect(process.argv[2]).on('connect', function () { console.log('connected'); this.end(); }).on('error', (e) => console.log(e.code));`);
  });
  afterAll(async () => {
    await node?.stop();
  });

  it('the socket is root:<group> 0660; a member is served, a non-member gets EACCES, the admin socket stays root only', async () => {
    const sock = socketPath(node.dirs.runDir, 'server');
    const st = statSync(sock);
    expect({ mode: st.mode & 0o777, uid: st.uid, gid: st.gid }).toEqual({ mode: 0o660, uid: 0, gid: GROUP_GID });
    const as = (gid: number, script: string, args: string[]) =>
      new Promise<string>((resolve, reject) => {
        const p = spawn(process.execPath, [script, ...args], { uid: NOBODY, gid, stdio: ['ignore', 'pipe', 'inherit'] });
        let out = '';
        p.stdout.on('data', (d: Buffer) => (out += d.toString()));
        p.on('error', reject);
        p.on('close', () => resolve(out.trim()));
      });
    expect(await as(GROUP_GID, call, [unixAddress(sock), '/sandnode.server.v1.SandboxService/ListSandboxes'])).toBe('0 ok');
    expect(await as(1, connect, [sock])).toBe('EACCES'); // gid 1 (daemon): not in the group
    const admin = readdirSync(node.dirs.runDir).find((n) => /^server-.*-admin\.sock$/.test(n))!;
    expect(await as(GROUP_GID, connect, [path.join(node.dirs.runDir, admin)])).toBe('EACCES');
  });
});
