import { canTransition, ROLE_TRANSITIONS, Roles, type Role } from './roles';

describe('server roles', () => {
  const all: Role[] = ['STANDBY', 'ACTIVE', 'HANDING_OVER', 'RETIRING'];

  it('the table is the header diagram', () => {
    const edges = all.flatMap((f) => all.filter((t) => canTransition(f, t)).map((t) => `${f}->${t}`));
    expect(edges).toEqual(['STANDBY->ACTIVE', 'ACTIVE->HANDING_OVER', 'HANDING_OVER->ACTIVE', 'HANDING_OVER->RETIRING']);
    expect(ROLE_TRANSITIONS.RETIRING).toEqual([]);
  });

  it('to() follows the table and refuses anything else', () => {
    const r = new Roles();
    expect(r.role).toBe('STANDBY');
    expect(() => r.to('HANDING_OVER')).toThrow('STANDBY -> HANDING_OVER is not a transition');
    r.to('ACTIVE', { newEpoch: true });
    const since = r.activeSinceMs;
    expect(since).toBeGreaterThan(0);
    r.to('HANDING_OVER');
    r.to('ACTIVE'); // a handover aborted before the lease was released: same epoch
    expect(r.activeSinceMs).toBe(since);
    r.to('HANDING_OVER');
    r.to('RETIRING');
    expect(() => r.to('ACTIVE')).toThrow('RETIRING -> ACTIVE is not a transition');
    expect(r.is('RETIRING')).toBe(true);
  });
});
