/**
 * The role of one server process on the node (ARCHITECTURE.md section 4). Every role change
 * goes through {@link Roles.to}, which checks it against {@link ROLE_TRANSITIONS}; the diagram
 * below is that table, edge by edge:
 *
 *   STANDBY ──lease free at start / lease freed (the active died) / takeover done──> ACTIVE
 *   ACTIVE ──Handover (calls held, sockets sent, lease released)──> HANDING_OVER
 *   HANDING_OVER ──failed before the lease was released──> ACTIVE
 *   HANDING_OVER ──standby died or no FinishHandover, lease retaken (epoch+1)──> ACTIVE
 *   HANDING_OVER ──FinishHandover / the standby holds the lease without finishing──> RETIRING
 *   RETIRING ──running streams finished──> (process exits)
 *
 * A process starts as STANDBY (it holds nothing); `start` moves it to ACTIVE at once when the
 * lease is free. RETIRING is final.
 */
import { InternalError } from '@sandnode/shared';

/** A server's role. */
export type Role = 'STANDBY' | 'ACTIVE' | 'HANDING_OVER' | 'RETIRING';

/** The allowed role changes: from -> the roles it may go to. */
export const ROLE_TRANSITIONS: Readonly<Record<Role, readonly Role[]>> = {
  STANDBY: ['ACTIVE'],
  ACTIVE: ['HANDING_OVER'],
  HANDING_OVER: ['ACTIVE', 'RETIRING'],
  RETIRING: [],
};

/** canTransition says whether the table allows from -> to. */
export function canTransition(from: Role, to: Role): boolean {
  return ROLE_TRANSITIONS[from].includes(to);
}

/** Roles holds the current role and when the server last became ACTIVE. */
export class Roles {
  private current: Role = 'STANDBY';
  /** When this server last became ACTIVE with a new epoch (start, failover, takeover, lease retaken), Unix ms; 0 if never. */
  activeSinceMs = 0;

  get role(): Role {
    return this.current;
  }

  /** is says whether the role is one of roles. */
  is(...roles: Role[]): boolean {
    return roles.includes(this.current);
  }

  /**
   * to changes the role; throws InternalError (a bug, never a caller's mistake) when the table
   * does not allow it. `newEpoch` marks a move to ACTIVE that took a new epoch (sets
   * activeSinceMs).
   */
  to(next: Role, opts: { newEpoch?: boolean } = {}): void {
    if (!canTransition(this.current, next)) throw new InternalError(`server role: ${this.current} -> ${next} is not a transition`);
    this.current = next;
    if (next === 'ACTIVE' && opts.newEpoch) this.activeSinceMs = Date.now();
  }
}
