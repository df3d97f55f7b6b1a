import { gapIn, timelineOf } from './gaps';
import { costPer, parseHostCommands } from './vmm-cost';

describe('gapIn', () => {
  it('takes the longest pause between successes inside the window and across its edges', () => {
    expect(gapIn([0, 10, 12, 40, 45, 47, 100], 11, 46)).toBe(28);
    // up to the first success after the window
    expect(gapIn([0, 10, 12, 40, 41, 100], 11, 41)).toBe(59);
    // the outage starts before the window and ends after it
    expect(gapIn([0, 10, 200], 50, 60)).toBe(190);
    // one success inside: both edges count
    expect(gapIn([0, 10, 30, 35], 20, 31)).toBe(20);
  });

  it('counts an outage that runs past the window up to its edges', () => {
    expect(gapIn([], 100, 150)).toBe(50);
    expect(gapIn([90], 100, 150)).toBe(60);
    expect(gapIn([160], 100, 150)).toBe(60);
  });
});

describe('vmm cost', () => {
  it('reads the host-command counter and divides a step by what it did', () => {
    const page = '# HELP x\nsandnode_vmm_host_commands_total{command="runc state"} 7\nsandnode_vmm_host_commands_total{command="umount"} 2\nother_total 5\n';
    expect(parseHostCommands(page)).toEqual({ 'runc state': 7, umount: 2 });
    const before = { commands: { 'runc state': 7, umount: 2 }, cpuMs: 100, sysMs: 40, serverCpuMs: 10 };
    const after = { commands: { 'runc state': 13, umount: 2, 'runc delete': 2 }, cpuMs: 160, sysMs: 60, serverCpuMs: 14 };
    expect(costPer(before, after, 2)).toEqual({ processStarts: 4, byCommand: { 'runc state': 3, 'runc delete': 1 }, cpuMs: 30, sysMs: 10, serverCpuMs: 2 });
  });
});

describe('timelineOf', () => {
  it('keeps the successes inside the window and the nearest one on each side, relative to its start', () => {
    expect(timelineOf([0, 10, 12, 40, 45, 47, 100], 11, 46)).toEqual([-1, 1, 29, 34, 36]);
    // none before, none after: only the inside ones
    expect(timelineOf([20, 25], 10, 30)).toEqual([10, 15]);
    // an outage across the window: the edges' neighbours only, so gapIn's 190 ms shows
    expect(timelineOf([0, 10, 200], 50, 60)).toEqual([-40, 150]);
  });
});
