/** The idle flags of `sandbox create` and how a sandbox's idle settings are shown. */
import { Command } from 'commander';
import { addIdleFlags, idleLine, idleRequest, type IdleFlags } from './sandbox-idle';

function parse(args: string[]): IdleFlags {
  const c = addIdleFlags(new Command('create').exitOverride().configureOutput({ writeErr: () => undefined }));
  c.parse(args, { from: 'user' });
  return c.opts<IdleFlags>();
}

describe('sandbox create idle flags', () => {
  it('no flag: no idle settings (the server does nothing when idle)', () => {
    expect(idleRequest(parse([]))).toBeUndefined();
  });

  it('the flags make CreateSandboxRequest.idle; --no-auto-resume alone is idle settings too', () => {
    expect(idleRequest(parse(['--pause-after-s', '60', '--hibernate-after-s', '600', '--paused-ttl-s', '86400']))).toEqual({
      pauseAfterS: 60,
      hibernateAfterS: 600,
      pausedTtlS: 86400,
      autoResume: true,
    });
    expect(idleRequest(parse(['--no-auto-resume']))).toEqual({ pauseAfterS: 0, hibernateAfterS: 0, pausedTtlS: 0, autoResume: false });
  });

  it('a negative or fractional value is a usage error', () => {
    expect(() => parse(['--pause-after-s', '-1'])).toThrow(/whole number/);
    expect(() => parse(['--paused-ttl-s', '1.5'])).toThrow(/whole number/);
  });

  it('idleLine says the settings, the next action and the lease', () => {
    const line = idleLine({
      pause_after_s: 60,
      hibernate_after_s: 0,
      paused_ttl_s: 300,
      auto_resume: false,
      last_activity_at: '2026-12-01T00:00:00.000Z',
      keep_alive_until: '2026-12-01T01:00:00.000Z',
      next_action: 'pause',
      next_action_at: '2026-12-01T01:01:00.000Z',
      paused_at: null,
      hibernated: false,
    });
    expect(line).toBe('idle: pause after 60 s, delete 300 s after pause, no auto-resume; next: pause at 2026-12-01T01:01:00.000Z; kept alive until 2026-12-01T01:00:00.000Z');
    expect(idleLine(null)).toBe('');
  });
});
