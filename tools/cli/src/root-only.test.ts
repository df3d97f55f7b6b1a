import { CliError } from './output';
import { asRootOnly } from './root-only';

describe('asRootOnly', () => {
  it("an EACCES/EPERM (a non-root user on root's run dir) says the command needs root, with the raw message", () => {
    const raw = Object.assign(new Error("EACCES: permission denied, open '/run/sandnode/up.lock'"), { code: 'EACCES' });
    const e = asRootOnly('up', raw);
    expect(e).toBeInstanceOf(CliError);
    expect((e as Error).message).toMatch(/^sandnode up needs root: .*EACCES: permission denied, open '\/run\/sandnode\/up\.lock'.*run it as root/);
    expect(asRootOnly('down', Object.assign(new Error('EPERM: operation not permitted'), { code: 'EPERM' }))).toBeInstanceOf(CliError);
  });

  it('any other error is returned as it is', () => {
    const other = Object.assign(new Error('ENOSPC'), { code: 'ENOSPC' });
    expect(asRootOnly('up', other)).toBe(other);
    expect(asRootOnly('up', 'x')).toBe('x');
  });
});
