/**
 * `sandnode up` while the server runs but does not answer (SIGSTOP): it fails naming the pid
 * and starts no second server; after SIGCONT `status` shows the original one. An `up` whose
 * server fails to start stops the daemons that same `up` started. `up` says what each daemon
 * listens on (OPENS, from /proc) and warns, naming the holder, when the ingress port is taken.
 * A bare `up` after a daemon died starts it with the settings the last `up` was given.
 */
import net from 'node:net';
import { spawnSync } from 'node:child_process';
import { findRunning, metricsOf, sandnodeProcesses } from '@sandnode/node-stack';
import { describeNode, serverProcesses, startNode, waitFor, type TestNode } from '@sandnode/testkit';

jest.setTimeout(180_000);

describeNode('sandnode up when a component does not start', () => {
  let node: TestNode;
  let pid = 0;
  beforeAll(async () => {
    node = await startNode({ buildTemplate: false });
  });
  afterAll(async () => {
    if (pid) process.kill(pid, 'SIGCONT');
    await node?.stop();
  });

  it('fails naming the pid, starts no second server, and the original answers after SIGCONT', async () => {
    pid = findRunning(node.dirs, 'server')!.pid;
    expect(serverProcesses(node.dirs.runDir)).toEqual([pid]);
    process.kill(pid, 'SIGSTOP');
    const r = node.cli(['up', '--start-timeout-ms', '1500']);
    expect(r.status).toBe(1);
    expect(r.stderr).toContain(`server pid ${pid} is running but does not answer within 1500 ms (state T: stopped?`);
    // the daemons that ran before this up are left alone
    expect(r.stderr).toContain('up undone: nothing this up started');
    expect(serverProcesses(node.dirs.runDir)).toEqual([pid]);
    expect(findRunning(node.dirs, 'server')?.pid).toBe(pid);

    process.kill(pid, 'SIGCONT');
    await waitFor('the server to answer', () => JSON.parse(node.cli(['status', '--json']).stdout).components[2].up === true, 20_000);
    const st = JSON.parse(node.cli(['status', '--json']).stdout) as { components: { name: string; pid: number; up: boolean }[] };
    expect(st.components.find((c) => c.name === 'server')).toMatchObject({ pid, up: true });
    expect(serverProcesses(node.dirs.runDir)).toEqual([pid]);
    const again = node.cli(['up', '--json']);
    expect(again.status).toBe(0);
    expect(JSON.parse(again.stdout).components.every((c: { started: boolean }) => !c.started)).toBe(true);
  });

  it('stops what it started when a later component fails to start', () => {
    pid = 0;
    expect(node.cli(['status']).status).toBe(0);
    expect(node.cli(['down']).status).toBe(0);
    expect(sandnodeProcesses(node.dirs.runDir)).toEqual([]);
    // scripts ask status whether the node runs: 3 (LSB "not running") with the report printed all the same
    const down = node.cli(['status', '--json']);
    expect(down.status).toBe(3);
    expect((JSON.parse(down.stdout) as { components: { up: boolean }[] }).components.map((c) => c.up)).toEqual([false, false, false]);
    // a bad config value: the server exits 2 at once
    const d = node.dirs;
    const r = spawnSync(process.execPath, [require.resolve('@sandnode/cli/dist/main.js'), '--state-dir', d.stateDir, '--run-dir', d.runDir, '--listen', '', 'up'], {
      encoding: 'utf8',
      timeout: 120_000,
      env: { ...process.env, SANDNODE_SERVER_LOG_LEVEL: 'bogus' },
    });
    expect(r.status).toBe(1);
    expect(r.stderr).toContain('server exited with code 2 while starting');
    expect(r.stderr).toMatch(/up undone: stopped ublk-manager pid \d+; stopped vmm-supervisor pid \d+/);
    expect(sandnodeProcesses(node.dirs.runDir)).toEqual([]);
    expect(node.cli(['up']).status).toBe(0);
  });

  it('lists what each daemon listens on, and warns naming the holder when the ingress port is taken (the node runs without ingress)', async () => {
    expect(node.cli(['down']).status).toBe(0);
    const squatter = net.createServer();
    await new Promise<void>((resolve) => squatter.listen(0, '127.0.0.1', resolve));
    const address = `127.0.0.1:${(squatter.address() as net.AddressInfo).port}`;
    try {
      const d = node.dirs;
      const r = spawnSync(process.execPath, [require.resolve('@sandnode/cli/dist/main.js'), '--state-dir', d.stateDir, '--run-dir', d.runDir, '--listen', '', 'up', '--json'], {
        encoding: 'utf8',
        timeout: 120_000,
        env: { ...process.env, SANDNODE_SERVER_INGRESS_LISTEN: address, SANDNODE_SERVER_METRICS_LISTEN: address },
      });
      expect({ status: r.status, stderr: r.stderr }).toMatchObject({ status: 0 });
      // the metrics port taken too: said with its holder (before: only "in use; retrying" in the METRICS column)
      expect(r.stderr).toContain(`sandnode: warning: server cannot serve /metrics on ${address}: the address is taken by pid ${process.pid}`);
      expect(r.stderr).toContain('SANDNODE_SERVER_METRICS_LISTEN');
      expect(r.stderr).toContain(`sandnode: warning: the server could not open its ingress listener on ${address} (the address is taken by pid ${process.pid}`);
      expect(r.stderr).toContain('SANDNODE_SERVER_INGRESS_LISTEN');
      // and one hint pointing to the second-node settings (before: each warning alone, no word of a second node)
      const hints = r.stderr.split('\n').filter((l) => l.startsWith('sandnode: hint: '));
      expect(hints).toHaveLength(1);
      expect(hints[0]).toMatch(/the ingress port, .*the server metrics port of this node are held elsewhere .*SANDNODE_SERVER_INGRESS_LISTEN=127\.0\.0\.1:8481 /);
      const out = JSON.parse(r.stdout) as { components: { name: string; opens: string[]; listenerFailures?: unknown[] }[] };
      for (const c of out.components) expect(c.opens.some((o) => o.startsWith(`unix ${d.runDir}/`))).toBe(true);
      const server = out.components.find((c) => c.name === 'server')!;
      expect(server.listenerFailures).toEqual([{ listener: 'ingress', address, error: 'EADDRINUSE' }]);
      expect(server.opens).not.toContain(`tcp ${address}`);
      // the table shows the same column
      expect(node.cli(['up']).stdout).toMatch(/OPENS[\s\S]*unix /);
      // status says it too, for as long as that server runs (before: silent)
      const st = node.cli(['status']);
      expect(st.stdout).toContain(`listener off: the server could not open its ingress listener on ${address}`);
      expect((JSON.parse(node.cli(['status', '--json']).stdout) as { listenerFailures: unknown[] }).listenerFailures).toEqual([{ listener: 'ingress', address, error: 'EADDRINUSE' }]);
    } finally {
      squatter.close();
    }
    expect(node.cli(['down']).status).toBe(0);
    expect(node.cli(['up']).status).toBe(0);
  });

  it("a bare up after a daemon died starts it with the settings the last up was given (the node's record), and says so", async () => {
    expect(node.cli(['down']).status).toBe(0);
    const probe = net.createServer();
    await new Promise<void>((resolve) => probe.listen(0, '127.0.0.1', resolve));
    const address = `127.0.0.1:${(probe.address() as net.AddressInfo).port}`;
    await new Promise<void>((resolve) => probe.close(() => resolve()));
    const d = node.dirs;
    const r = spawnSync(process.execPath, [require.resolve('@sandnode/cli/dist/main.js'), '--state-dir', d.stateDir, '--run-dir', d.runDir, '--listen', '', 'up'], {
      encoding: 'utf8',
      timeout: 120_000,
      env: { ...process.env, SANDNODE_VMM_SUPERVISOR_METRICS_LISTEN: address },
    });
    expect({ status: r.status, stderr: r.stderr }).toMatchObject({ status: 0 });
    const served = (pid: number) => metricsOf(d.runDir)['vmm-supervisor']?.pid === pid && metricsOf(d.runDir)['vmm-supervisor']?.url === `http://${address}/metrics`;
    await waitFor('the supervisor to serve /metrics on the given address', () => served(findRunning(d, 'vmm-supervisor')!.pid), 20_000);

    const sup = findRunning(d, 'vmm-supervisor')!.pid;
    process.kill(sup, 'SIGKILL');
    await waitFor('the supervisor to be gone', () => findRunning(d, 'vmm-supervisor') === undefined, 20_000);
    const again = node.cli(['up']);
    expect({ status: again.status, stderr: again.stderr }).toMatchObject({ status: 0 });
    expect(again.stderr).toContain(`the daemons started with the node's recorded settings (${d.stateDir}/node-settings.json): SANDNODE_VMM_SUPERVISOR_METRICS_LISTEN=${address}`);
    const now = findRunning(d, 'vmm-supervisor')!.pid;
    expect(now).not.toBe(sup);
    await waitFor('the new supervisor to serve /metrics on the recorded address', () => served(now), 20_000);
  });
});
