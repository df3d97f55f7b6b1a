import { getValueText } from './sandbox';

const idle = {
  pause_after_s: 2,
  hibernate_after_s: 4,
  paused_ttl_s: 0,
  auto_resume: true,
  last_activity_at: '2026-12-01T00:00:00.000Z',
  keep_alive_until: null,
  next_action: 'pause',
  next_action_at: '2026-12-01T00:00:02.000Z',
  paused_at: null,
  hibernated: false,
};

describe('sandbox get for people', () => {
  it('shows idle settings in words, as create does, not as a JSON blob (newcomer)', () => {
    const t = getValueText('idle', idle, { idle } as never);
    expect(t).toBe('pause after 2 s, hibernate after 4 s; next: pause at 2026-12-01T00:00:02.000Z');
    expect(t).not.toContain('{');
    expect(getValueText('idle', null, { idle: null } as never)).toBe('none');
  });

  it('other objects stay one JSON line; a sandbox without network says none', () => {
    expect(getValueText('metadata', { a: '1' }, {} as never)).toBe('{"a":"1"}');
    expect(getValueText('network', null, {} as never)).toBe('none');
    expect(getValueText('pid', 7, {} as never)).toBe('7');
  });
});
