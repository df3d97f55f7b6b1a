/** The per-VM network files a networked runc VM sees read-only: /etc/resolv.conf and /etc/hosts. */
import { mkdirSync, writeFileSync } from 'node:fs';
import path from 'node:path';

/** resolvConfText names the gateway (the node's resolver answers there) as the only nameserver. */
export function resolvConfText(gateway: string): string {
  return `# written by sandnode: the node's resolver on the gateway\nnameserver ${gateway}\noptions ndots:0 timeout:2 attempts:2\n`;
}

/** hostsText maps localhost and the VM's hostname (to its own address). */
export function hostsText(hostname: string, address: string): string {
  return `127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n${address}\t${hostname}\n`;
}

/**
 * writeNetFiles writes `<vmDir>/net/{resolv.conf,hosts}` (0644, root's) and returns what
 * buildOciSpec needs to bind them and join the slot's netns.
 */
export function writeNetFiles(vmDir: string, net: { netnsPath: string; gateway: string; address: string }, hostname: string): { netnsPath: string; resolvConf: string; hosts: string } {
  const dir = path.join(vmDir, 'net');
  mkdirSync(dir, { recursive: true, mode: 0o755 });
  const resolvConf = path.join(dir, 'resolv.conf');
  const hosts = path.join(dir, 'hosts');
  writeFileSync(resolvConf, resolvConfText(net.gateway), { mode: 0o644 });
  writeFileSync(hosts, hostsText(hostname, net.address), { mode: 0o644 });
  return { netnsPath: net.netnsPath, resolvConf, hosts };
}
