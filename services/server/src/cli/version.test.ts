import { UNKNOWN_RUNTIME, versionRow, versionTable } from './version';

const answer = { component: 'server', version: '0.3.0', commit: 'a'.repeat(40), features: [], pid: 42, startedAtMs: 1, runtime: 'node 24.22.3' };

describe('sandnode version rows', () => {
  it('keeps what a daemon says, and says unknown for a daemon that predates the runtime field', () => {
    expect(versionRow('server', answer)).toEqual({ name: 'server', up: true, version: '0.3.0', commit: 'a'.repeat(40), runtime: 'node 24.22.3', pid: 42 });
    expect(versionRow('server', { ...answer, runtime: '' }).runtime).toBe(UNKNOWN_RUNTIME);
  });

  it('marks a daemon that does not answer as down, with nulls', () => {
    expect(versionRow('ublk-manager', undefined)).toEqual({ name: 'ublk-manager', up: false, version: null, commit: null, runtime: null, pid: null });
  });

  it('prints one line per component with a short commit and "-" for a down daemon', () => {
    const lines = versionTable([versionRow('server', answer), versionRow('vmm-supervisor', undefined)]).split('\n');
    expect(lines).toHaveLength(3);
    expect(lines[1]).toMatch(/^server\s+up\s+0\.3\.0\s+a{12}\s+node 24\.22\.3\s+42$/);
    expect(lines[2]).toMatch(/^vmm-supervisor\s+down\s+-\s+-\s+-\s+-$/);
  });
});
