/**
 * The one Node warning the CLI does not print. grpc-js (1.14, channel-credentials.js
 * getConnectionOptions) passes the target's host to tls.connect as `servername` whatever it is,
 * and has no option to leave it out (`grpc.ssl_target_name_override` only replaces it), so
 * `--address 127.0.0.1:7070 --tls-ca ...` made Node print DEP0123 ("Setting the TLS ServerName to
 * an IP address is not permitted by RFC 6066") before every answer. The certificate is still
 * checked against the IP (checkServerIdentity gets the host, not the servername), so the warning
 * tells an operator nothing they can act on.
 */

/** The code of the warning {@link quietIpServername} drops. */
export const IP_SERVERNAME_WARNING = 'DEP0123';

/** codeOf: the code of a process.emitWarning call (its 3rd argument, or the options object's `code`, or the Error's). */
function codeOf(warning: unknown, rest: unknown[]): unknown {
  const [typeOrOpts, code] = rest;
  if (typeof typeOrOpts === 'object' && typeOrOpts !== null) return (typeOrOpts as { code?: unknown }).code;
  return code ?? (warning as { code?: unknown } | null)?.code;
}

/** quietIpServername makes process.emitWarning drop DEP0123 (see the file header) and pass every other warning on as before. Idempotent. */
export function quietIpServername(): void {
  const current = process.emitWarning as typeof process.emitWarning & { quietIpServername?: true };
  if (current.quietIpServername) return;
  const wrapped = function (this: unknown, warning: string | Error, ...rest: unknown[]) {
    if (codeOf(warning, rest) === IP_SERVERNAME_WARNING) return;
    return (current as (...a: unknown[]) => void).call(process, warning, ...rest);
  };
  process.emitWarning = Object.assign(wrapped, { quietIpServername: true as const }) as typeof process.emitWarning;
}
