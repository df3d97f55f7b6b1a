/**
 * Adoption repairs the kernel network of running sandboxes (issue 12 §4: "adoption verifies
 * netns, veth, addresses and rules and repairs what differs"), on a whole node: while the
 * vmm-supervisor is down (kill -9), a sandbox's host veth is deleted (its eth0 goes with it), the
 * node's nftables table is deleted, and another sandbox's netns bind mount is unmounted; once the
 * supervisor is back, both sandboxes reach the test internet again as their policies say, the
 * bind mount is back, and strays of the node's names (a veth, a netns file) no row owns are gone.
 */
import { execFileSync, spawnSync } from 'node:child_process';
import { existsSync, readFileSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { COMPONENTS, killComponent, purgeNode, startComponent } from '@sandnode/node-stack';
import { describeNode, startTestInternet, waitFor, type TestInternet, type TestNode } from '@sandnode/testkit';
import { create, echo, fetchIn, startNetworkNode } from './network-helpers';

jest.setTimeout(300_000);

function mounted(p: string): boolean {
  return readFileSync('/proc/self/mountinfo', 'utf8')
    .split('\n')
    .some((l) => l.split(' ')[4] === p);
}

describeNode('adoption repairs the kernel network of running sandboxes', () => {
  let node: TestNode;
  let inet: TestInternet;

  beforeAll(async () => {
    inet = await startTestInternet();
    node = await startNetworkNode(inet);
  });
  afterAll(async () => {
    await node?.stop();
    await inet?.stop();
  });

  test('a lost veth, a lost table, a lost netns mount and strays: repaired at the supervisor start', async () => {
    const plain = (await create(node)).sb;
    const { sb: ruled } = await create(node, { disabled: false, egress: { allowOut: [inet.names.allowed], denyOut: [], blockAll: true }, public: false });
    expect(await echo(node, plain.sandboxId, inet.address)).toBe('hi\n');
    expect(await fetchIn(node, ruled.sandboxId, `http://${inet.names.allowed}/`)).toMatch(/^200 /);
    const tag = node.dirs.network!.tag!;
    const ruledNetns = path.join(node.dirs.runDir, 'netns', String(ruled.network!.slot));
    // strays with the node's names: a veth and a netns file no slot row owns (slot 60 of the /24)
    const stray = { veth: `sn${tag}v60`, netns: path.join(node.dirs.runDir, 'netns', '60') };

    await killComponent(node.dirs, 'vmm-supervisor');
    execFileSync('ip', ['link', 'del', `sn${tag}v${plain.network!.slot}`]);
    execFileSync('nft', ['delete', 'table', 'inet', `sandnode-${tag}`]);
    execFileSync('umount', [ruledNetns]);
    execFileSync('ip', ['link', 'add', stray.veth, 'type', 'veth', 'peer', 'name', `sn${tag}x60`]);
    writeFileSync(stray.netns, '');
    expect(await echo(node, plain.sandboxId, inet.address)).toBe(''); // broken: no eth0

    await startComponent(node.dirs, 'vmm-supervisor');
    await waitFor('the plain sandbox reaches the echo again', async () => (await echo(node, plain.sandboxId, inet.address)) === 'hi\n', 30_000, 200);
    expect(await fetchIn(node, ruled.sandboxId, `http://${inet.names.allowed}/`)).toMatch(/^200 /);
    expect(await echo(node, ruled.sandboxId, inet.address)).toBe(''); // block_all holds again
    expect(mounted(ruledNetns)).toBe(true);
    expect(spawnSync('ip', ['link', 'show', 'dev', stray.veth], { stdio: 'ignore' }).status).not.toBe(0);
    expect(existsSync(stray.netns)).toBe(false);
    // the sandboxes are the same (not re-made), the node converged: a new one works
    for (const s of [plain, ruled]) expect((await node.api.sandboxes.getSandbox({ sandboxId: s.sandboxId })).sandbox!.pid).toBe(s.pid);
    const fresh = (await create(node)).sb;
    expect(await echo(node, fresh.sandboxId, inet.address)).toBe('hi\n');
    for (const s of [fresh, ruled, plain]) await node.api.sandboxes.deleteSandbox({ sandboxId: s.sandboxId });
  });

  test('down --purge (purgeNode) with every daemon killed and networked sandboxes still running: nothing of the node is left', async () => {
    const made = [];
    for (const pub of [false, true]) made.push((await create(node, { disabled: false, egress: undefined, public: pub })).sb);
    for (const s of made) expect(await echo(node, s.sandboxId, inet.address)).toBe('hi\n');
    const tag = node.dirs.network!.tag!;
    const { runDir } = node.dirs;
    const docker = spawnSync('iptables', ['-w', '-S', 'DOCKER-USER'], { encoding: 'utf8' });
    node.api.close();
    for (const c of [...COMPONENTS].reverse()) await killComponent(node.dirs, c);
    const report = await purgeNode(node.dirs);
    console.log(`purge: ${JSON.stringify(report.network)}`);
    expect(spawnSync('nft', ['list', 'table', 'inet', `sandnode-${tag}`], { stdio: 'ignore' }).status).not.toBe(0);
    expect(execFileSync('ip', ['-o', 'link', 'show'], { encoding: 'utf8' })).not.toMatch(new RegExp(`: sn${tag}v\\d+[@:]`));
    expect(readFileSync('/proc/self/mountinfo', 'utf8')).not.toContain(runDir);
    for (const s of made) expect(existsSync(`/proc/${s.pid}`) && !readFileSync(`/proc/${s.pid}/stat`, 'utf8').includes(') Z ')).toBe(false);
    if (docker.status === 0) expect(spawnSync('iptables', ['-w', '-S', 'DOCKER-USER'], { encoding: 'utf8' }).stdout).not.toContain(`sn${tag}v+`);
    // the host still routes the test internet (nothing but the node's state was touched)
    expect(spawnSync('ip', ['netns', 'exec', inet.netns, 'true']).status).toBe(0);
  });
});
