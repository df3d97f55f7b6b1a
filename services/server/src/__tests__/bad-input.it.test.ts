/**
 * Bad input gets a clear gRPC status naming the field and changes nothing (issue: section 6).
 * Each case asserts the exact code; after all of them the node holds exactly what it held.
 */
import { spawnSync } from 'node:child_process';
import path from 'node:path';
import { Status } from 'nice-grpc-common';
import { loopDevicesBelow, mountsBelow } from '@sandnode/node-stack';
import { built, describeNode, describeWith, execCollect, expectCode, startNode, type TestNode } from '@sandnode/testkit';

jest.setTimeout(180_000);

const MIB = 1024 * 1024;

describeNode('bad input on a real node', () => {
  let node: TestNode;
  let running: string;
  let paused: string;
  let before: { ids: string[]; loops: string[]; mounts: string[] };

  const snapshot = async () => ({
    ids: (await node.api.sandboxes.listSandboxes({})).sandboxes.map((s) => `${s.sandboxId}:${s.state}:${s.pid}`),
    loops: loopDevicesBelow(node.dirs.stateDir),
    mounts: mountsBelow([node.dirs.runDir, node.dirs.stateDir]),
  });

  beforeAll(async () => {
    node = await startNode();
    running = (await node.api.sandboxes.createSandbox({ template: 'base' })).sandbox!.sandboxId;
    paused = (await node.api.sandboxes.createSandbox({ template: 'base' })).sandbox!.sandboxId;
    await node.api.sandboxes.pauseSandbox({ sandboxId: paused });
    // symlinks inside /workspace that lead out of it
    await execCollect(node.api, running, ['sh', '-c', 'ln -s /etc /workspace/etclink && ln -s /etc/passwd /workspace/pw && ln -s /dev/zero /workspace/zero']);
    before = await snapshot();
  });
  afterAll(async () => {
    await node?.stop();
  });

  const drain = (it: AsyncIterable<unknown>) => async () => {
    for await (const _ of it) void _;
  };

  const cases: [string, Status, RegExp, () => Promise<unknown>][] = [
    ['GetSandbox with a malformed id', Status.INVALID_ARGUMENT, /sandbox_id/, () => node.api.sandboxes.getSandbox({ sandboxId: 'not-an-id' })],
    ['GetSandbox of an unknown id', Status.NOT_FOUND, /sb-0000000000000000/, () => node.api.sandboxes.getSandbox({ sandboxId: 'sb-0000000000000000' })],
    ['DeleteSandbox of an unknown id', Status.NOT_FOUND, /not found/, () => node.api.sandboxes.deleteSandbox({ sandboxId: 'sb-0000000000000001' })],
    ['CreateSandbox from an unknown template', Status.NOT_FOUND, /template/, () => node.api.sandboxes.createSandbox({ template: 'nope' })],
    ['CreateSandbox with an empty template', Status.INVALID_ARGUMENT, /template/, () => node.api.sandboxes.createSandbox({ template: '' })],
    ['CreateSandbox with a path as template', Status.INVALID_ARGUMENT, /template/, () => node.api.sandboxes.createSandbox({ template: '../etc' })],
    ['CreateSandbox with 65 vcpus', Status.INVALID_ARGUMENT, /resources\.vcpus/, () => node.api.sandboxes.createSandbox({ template: 'base', resources: { vcpus: 65, memoryMib: 0, diskBytes: 0 } })],
    [
      'CreateSandbox with 1 MiB memory',
      Status.INVALID_ARGUMENT,
      /resources\.memory_mib/,
      () => node.api.sandboxes.createSandbox({ template: 'base', resources: { vcpus: 0, memoryMib: 1, diskBytes: 0 } }),
    ],
    [
      'CreateSandbox with a 1-byte disk',
      Status.INVALID_ARGUMENT,
      /resources\.disk_bytes/,
      () => node.api.sandboxes.createSandbox({ template: 'base', resources: { vcpus: 0, memoryMib: 0, diskBytes: 1 } }),
    ],
    [
      'CreateSandbox with a 2 TiB disk',
      Status.INVALID_ARGUMENT,
      /resources\.disk_bytes/,
      () => node.api.sandboxes.createSandbox({ template: 'base', resources: { vcpus: 0, memoryMib: 0, diskBytes: 2 * 1024 * 1024 * MIB } }),
    ],
    ['CreateSandbox with a huge timeout', Status.INVALID_ARGUMENT, /timeout_seconds/, () => node.api.sandboxes.createSandbox({ template: 'base', timeoutSeconds: 2592001 })],
    ['CreateSandbox with a bad metadata key', Status.INVALID_ARGUMENT, /metadata/, () => node.api.sandboxes.createSandbox({ template: 'base', metadata: { 'bad key!': 'x' } })],
    [
      'CreateSandbox with 65 metadata entries',
      Status.INVALID_ARGUMENT,
      /metadata/,
      () => node.api.sandboxes.createSandbox({ template: 'base', metadata: Object.fromEntries(Array.from({ length: 65 }, (_, i) => [`k${i}`, 'v'])) }),
    ],
    ['CreateSandbox with a bad request_id', Status.INVALID_ARGUMENT, /request_id/, () => node.api.sandboxes.createSandbox({ template: 'base', requestId: 'has space' })],
    ['Exec with an empty command', Status.INVALID_ARGUMENT, /argv/, () => drain(node.api.sandboxes.exec({ sandboxId: running, argv: [] }))()],
    ['Exec with an empty argv[0]', Status.INVALID_ARGUMENT, /argv/, () => drain(node.api.sandboxes.exec({ sandboxId: running, argv: [''] }))()],
    ['Exec of a command that does not exist', Status.NOT_FOUND, /no-such-command/, () => drain(node.api.sandboxes.exec({ sandboxId: running, argv: ['no-such-command'] }))()],
    ['Exec in a paused sandbox', Status.FAILED_PRECONDITION, /PAUSED/, () => drain(node.api.sandboxes.exec({ sandboxId: paused, argv: ['true'] }))()],
    ['PauseSandbox of a paused sandbox', Status.FAILED_PRECONDITION, /PAUSED/, () => node.api.sandboxes.pauseSandbox({ sandboxId: paused })],
    ['ResumeSandbox of a running sandbox', Status.FAILED_PRECONDITION, /RUNNING/, () => node.api.sandboxes.resumeSandbox({ sandboxId: running })],
    ['ReadFile with ".."', Status.INVALID_ARGUMENT, /path.*"\.\."/, () => node.api.sandboxes.readFile({ sandboxId: running, path: '../etc/passwd' })],
    ['ReadFile with ".." inside an absolute path', Status.INVALID_ARGUMENT, /path/, () => node.api.sandboxes.readFile({ sandboxId: running, path: '/workspace/../etc/passwd' })],
    ['ReadFile outside /workspace', Status.INVALID_ARGUMENT, /outside \/workspace/, () => node.api.sandboxes.readFile({ sandboxId: running, path: '/etc/passwd' })],
    ['ReadFile with an empty path', Status.INVALID_ARGUMENT, /path/, () => node.api.sandboxes.readFile({ sandboxId: running, path: '' })],
    ['ReadFile of a missing file', Status.NOT_FOUND, /missing/, () => node.api.sandboxes.readFile({ sandboxId: running, path: 'missing.txt' })],
    ['ReadFile above 3 MiB', Status.INVALID_ARGUMENT, /length/, () => node.api.sandboxes.readFile({ sandboxId: running, path: 'x', length: 4 * MIB })],
    ['ReadFile through a symlink out of /workspace', Status.FAILED_PRECONDITION, /outside \/workspace/, () => node.api.sandboxes.readFile({ sandboxId: running, path: 'pw' })],
    ['ReadFile of a device through a symlink', Status.FAILED_PRECONDITION, /outside \/workspace/, () => node.api.sandboxes.readFile({ sandboxId: running, path: 'zero' })],
    [
      'WriteFile below a symlinked dir out of /workspace',
      Status.FAILED_PRECONDITION,
      /outside \/workspace/,
      () => node.api.sandboxes.writeFile({ sandboxId: running, path: 'etclink/evil', data: Buffer.from('x') }),
    ],
    ['WriteFile onto a symlink', Status.FAILED_PRECONDITION, /symlink/, () => node.api.sandboxes.writeFile({ sandboxId: running, path: 'pw', data: Buffer.from('x'), append: true })],
    ['WriteFile outside /workspace', Status.INVALID_ARGUMENT, /outside \/workspace/, () => node.api.sandboxes.writeFile({ sandboxId: running, path: '/etc/evil', data: Buffer.from('x') })],
    ['WriteFile of 3.5 MiB', Status.INVALID_ARGUMENT, /data/, () => node.api.sandboxes.writeFile({ sandboxId: running, path: 'big', data: Buffer.alloc(3.5 * MIB) })],
    ['WriteFile of an oversize message (5 MiB)', Status.RESOURCE_EXHAUSTED, /./, () => node.api.sandboxes.writeFile({ sandboxId: running, path: 'big', data: Buffer.alloc(5 * MIB) })],
    ['WriteFile in a paused sandbox', Status.FAILED_PRECONDITION, /PAUSED/, () => node.api.sandboxes.writeFile({ sandboxId: paused, path: 'a', data: Buffer.from('x') })],
    ['ListSandboxes with a forged page token', Status.INVALID_ARGUMENT, /page_token/, () => node.api.sandboxes.listSandboxes({ pageToken: 'garbage' })],
    ['ListSandboxes with page_size 5000', Status.INVALID_ARGUMENT, /page_size/, () => node.api.sandboxes.listSandboxes({ pageSize: 5000 })],
    ['SetTimeout above 30 days', Status.INVALID_ARGUMENT, /timeout_seconds/, () => node.api.sandboxes.setTimeout({ sandboxId: running, timeoutSeconds: 2592001 })],
    ['BuildTemplate of an existing template', Status.ALREADY_EXISTS, /base/, () => node.api.templates.buildTemplate({ name: 'base', replace: false })],
    ['BuildTemplate with a bad name', Status.INVALID_ARGUMENT, /name/, () => node.api.templates.buildTemplate({ name: 'Bad/Name', replace: false })],
    ['BuildTemplate replacing a template in use', Status.FAILED_PRECONDITION, /used by/, () => node.api.templates.buildTemplate({ name: 'base', replace: true })],
  ];

  it.each(cases)('%s -> %s', async (_name, want, msg, call) => {
    await expectCode(call(), want, msg);
  });

  it('changed nothing', async () => {
    expect(await snapshot()).toEqual(before);
    // nothing was written through the symlinks
    const etc = await execCollect(node.api, running, ['sh', '-c', 'ls /etc/evil 2>&1; tail -c 1 /etc/passwd | od -c | head -1']);
    expect(etc.stdout).toMatch(/No such file/);
  });
});

/** A bad command line or failpoint list is a usage error of the daemon (exit 2, naming it), before it touches anything. */
describeWith('sandnode-server usage errors', [built('@sandnode/server')], () => {
  const main = path.resolve(__dirname, '../../dist/main.js');
  const run = (args: string[], env: Record<string, string> = {}) => {
    const r = spawnSync(process.execPath, [main, ...args], { encoding: 'utf8', timeout: 30_000, env: { ...process.env, SANDNODE_SERVER_STATE_DIR: '/nonexistent/state', ...env } });
    return { status: r.status, stderr: r.stderr };
  };

  it.each([
    [['--config'], /--config needs a value/],
    [['--config', '--takeover'], /--config needs a value/],
    [['--bogus'], /unknown argument "--bogus"/],
    [['--config', '/x.json', 'extra'], /unknown argument "extra"/],
  ])('%j -> exit 2', (args, msg) => {
    const r = run(args);
    expect(r.status).toBe(2);
    expect(r.stderr).toMatch(msg);
  });

  it('an unknown failpoint in SANDNODE_SERVER_FAILPOINTS -> exit 2 naming it', () => {
    const r = run([], { SANDNODE_SERVER_FAILPOINTS: 'handover.after-nothing=kill' });
    expect(r.status).toBe(2);
    expect(r.stderr).toMatch(/SANDNODE_SERVER_FAILPOINTS: unknown failpoint "handover.after-nothing"/);
  });

  it('a bad config value -> exit 2 naming the key', () => {
    const r = run([], { SANDNODE_SERVER_TAKEOVER: 'ture' });
    expect(r.status).toBe(2);
    expect(r.stderr).toMatch(/key "takeover"/);
  });
});
