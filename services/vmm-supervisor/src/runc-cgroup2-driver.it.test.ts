/**
 * The runc driver on a cgroup v2 tree, with a real runc container (integration). This host is
 * hybrid: the driver's default there is the v1 freezer, as runc's; but runc also puts every
 * container in the v2 tree (`/sys/fs/cgroup/unified/sandnode/<id>`, its state's
 * cgroup_paths[""]), so a driver given that tree (option cgroupV2Root) runs the code a unified
 * host runs: pause writes cgroup.freeze (the v1 freezer stays THAWED: it was not used), inspect
 * reads paused/running from cgroup.events, resume thaws, and a stop of a paused VM kills it
 * through cgroup.kill — none of them starts a runc process (sandnode_vmm_host_commands_total).
 */
import { existsSync, mkdirSync, readFileSync } from 'node:fs';
import path from 'node:path';
import { createLogger, processLiveness } from '@sandnode/shared';
import { describeWith, PARTS } from '@sandnode/testkit';
import { Fixture } from './__tests__/fixture';
import type { VmRef } from './core/driver';
import { detectCgroupHierarchy } from './drivers/cgroup-hierarchy';
import { RuncDriver } from './drivers/runc';
import { readEvents, readFreeze2 } from './drivers/runc-cgroup2';
import { hostCommands } from './metrics';

/** commandsNow is hostCommands by label, read in-process. */
async function commandsNow(): Promise<Record<string, number>> {
  const m = await hostCommands.get();
  return Object.fromEntries(m.values.map((v) => [String(v.labels.command), v.value]));
}

/** startedBy is what step started: the host commands whose count rose. */
async function startedBy(step: () => Promise<unknown>): Promise<Record<string, number>> {
  const before = await commandsNow();
  await step();
  const after = await commandsNow();
  return Object.fromEntries(Object.entries(after).flatMap(([k, v]) => (v > (before[k] ?? 0) ? [[k, v - (before[k] ?? 0)]] : [])));
}

describeWith(
  'runc driver on the cgroup v2 tree: pause, inspect, resume, stop through cgroup.freeze / cgroup.kill (integration)',
  [PARTS.root, PARTS.runc, PARTS.busybox, PARTS.loop, PARTS.e2fsprogs, PARTS.cgroup2],
  () => {
    const v2Root = detectCgroupHierarchy().v2Root!;
    let fx: Fixture;
    let driver: RuncDriver;

    beforeAll(() => {
      // host commands in this process (the command helper is a built script; this test runs the TypeScript)
      process.env.SANDNODE_VMM_SUPERVISOR_COMMAND_HELPERS = '0';
      fx = new Fixture();
      fx.buildRootfs();
      driver = new RuncDriver({ runcBinary: 'runc', runcRoot: fx.runcRoot, runDir: fx.runDir, log: createLogger('test', '0', 'silent'), cgroupV2Root: v2Root });
    });

    afterAll(async () => {
      await fx?.cleanup();
    });

    it('pauses and resumes in the v2 tree, then stops the paused VM with cgroup.kill; no runc process for any of them', async () => {
      const vmId = `cgv2-drv-${process.pid}`;
      const poddDir = path.join(fx.runDir, 'sandboxes', vmId);
      mkdirSync(poddDir, { recursive: true });
      const started = await driver.create(
        vmId,
        {
          templateRootfs: fx.rootfs,
          drives: [{ driveId: 'upper', path: fx.makeExt4Loop(`${vmId}-upper`), role: 'rootfs-upper', readOnly: false }],
          resources: { vcpus: 1, memoryMib: 128, diskBytes: 0, pids: 0 },
          poddSocketDir: poddDir,
          hostname: vmId,
          env: {},
        },
        { vcpus: 1, memoryMib: 128, pids: 256 },
      );
      const vm: VmRef = { vmId, process: started.process, binary: '', apiSocket: '' };
      const dir = path.join(v2Root, 'sandnode', vmId);
      const v1Freezer = path.join('/sys/fs/cgroup/freezer/sandnode', vmId, 'freezer.state');
      try {
        expect(existsSync(dir)).toBe(true);
        expect(await driver.inspect(vm)).toEqual({ state: 'running', process: vm.process });

        expect(await startedBy(() => driver.pause(vm))).toEqual({});
        expect([readFreeze2(dir), readEvents(dir)?.frozen]).toEqual(['1', true]);
        if (existsSync(v1Freezer)) expect(readFileSync(v1Freezer, 'utf8').trim()).toBe('THAWED'); // the v2 tree did it
        expect(await driver.inspect(vm)).toEqual({ state: 'paused', process: vm.process });
        expect(driver.stats(vm)?.cpuUsageUsec).toBeGreaterThan(0);

        expect(await startedBy(() => driver.resume(vm))).toEqual({});
        expect([readFreeze2(dir), readEvents(dir)?.frozen]).toEqual(['0', false]);
        expect(await driver.inspect(vm)).toEqual({ state: 'running', process: vm.process });

        await driver.pause(vm);
        expect(await startedBy(() => driver.stop(vm, 1000))).toEqual({});
        expect(processLiveness(vm.process.pid, vm.process.startTimeTicks)).toBe('gone');
        expect(readEvents(dir)?.populated).toBe(false);
        expect(await driver.inspect(vm)).toMatchObject({ state: 'stopped' });
        expect(driver.stats(vm)).toBeUndefined(); // its init is gone: the cgroup is not found for sure
      } finally {
        await driver.destroy(vm).catch(() => undefined);
      }
      expect(existsSync(dir)).toBe(false);
    });
  },
);
