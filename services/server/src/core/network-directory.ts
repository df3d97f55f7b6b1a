/**
 * The server's in-memory view of its sandboxes' networks, for the egress proxy and resolver
 * (which look a connection up by its source address) and the ingress listener (which looks a
 * request up by sandbox id). The sandbox manager keeps it in step with the runtime records: it
 * is updated after a transition is persisted, and rebuilt from the records at adoption.
 */
import type { EgressPolicy } from '@sandnode/shared';
import type { SandboxState } from './types';

/** One networked sandbox as the proxies see it. */
export interface SandboxNetworkView {
  sandboxId: string;
  state: SandboxState;
  /** slot in the node's pool */
  slot: number;
  /** the sandbox's IPv4 address (source of its egress, target of its ingress) */
  address: string;
  /** the slot's host-side address */
  gateway: string;
  /** parsed egress policy in force */
  policy: EgressPolicy;
  /** ingress without access token */
  public: boolean;
  /** hex SHA-256 of the ingress access token */
  accessTokenSha256: string;
  /** how to reach the sandbox's podd ("unix:///abs/podd.sock"), for ForwardPort */
  poddAddress: string;
}

/** Lookups the proxies need; implementations must answer in O(1) (called per connection). */
export interface NetworkDirectory {
  /** byAddress is the sandbox whose address is `address` (dotted quad), if any. */
  byAddress(address: string): SandboxNetworkView | undefined;
  /** bySandboxId is the networked sandbox `sandboxId`, if any. */
  bySandboxId(sandboxId: string): SandboxNetworkView | undefined;
}

/** MapNetworkDirectory is the directory as two maps; `set`/`remove` keep them consistent. */
export class MapNetworkDirectory implements NetworkDirectory {
  private readonly ids = new Map<string, SandboxNetworkView>();
  private readonly addresses = new Map<string, SandboxNetworkView>();

  byAddress(address: string): SandboxNetworkView | undefined {
    return this.addresses.get(address);
  }

  bySandboxId(sandboxId: string): SandboxNetworkView | undefined {
    return this.ids.get(sandboxId);
  }

  /** set adds or replaces the view of view.sandboxId. */
  set(view: SandboxNetworkView): void {
    this.remove(view.sandboxId);
    this.ids.set(view.sandboxId, view);
    this.addresses.set(view.address, view);
  }

  /** remove drops sandboxId (no-op if absent). */
  remove(sandboxId: string): void {
    const old = this.ids.get(sandboxId);
    if (!old) return;
    this.ids.delete(sandboxId);
    if (this.addresses.get(old.address) === old) this.addresses.delete(old.address);
  }

  /** sandboxIds lists the sandbox ids in the directory (adoption drops those no record names). */
  sandboxIds(): string[] {
    return [...this.ids.keys()];
  }

  /** size is the number of networked sandboxes. */
  get size(): number {
    return this.ids.size;
  }
}
