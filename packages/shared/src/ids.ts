/**
 * Id and name rules shared by every contract. A bad value gets an InvalidArgumentError that
 * names the field. (Template names: TEMPLATE_NAME_RE of @sandnode/template-builder, which owns
 * the template layout.)
 */
import { InvalidArgumentError } from './errors';

/** Ids of VMs and devices: lowercase, digits and '-', 1..63 chars, starting alnum. */
export const RESOURCE_ID_RE = /^[a-z0-9][a-z0-9-]{0,62}$/;
/** Sandbox ids: "sb-" + 16 lowercase hex digits. */
export const SANDBOX_ID_RE = /^sb-[0-9a-f]{16}$/;

/** requireMatch throws InvalidArgumentError naming field unless value matches re. */
export function requireMatch(field: string, value: string, re: RegExp, what: string): string {
  if (!re.test(value)) {
    const shown = value.length > 80 ? `${value.slice(0, 80)}...` : value;
    throw new InvalidArgumentError(`${field}: ${JSON.stringify(shown)} is not a valid ${what} (${re.source})`);
  }
  return value;
}

/** requireResourceId validates a VM or device id. */
export function requireResourceId(field: string, value: string): string {
  return requireMatch(field, value, RESOURCE_ID_RE, 'id');
}

/** requireSandboxId validates a sandbox id. */
export function requireSandboxId(field: string, value: string): string {
  return requireMatch(field, value, SANDBOX_ID_RE, 'sandbox id');
}
