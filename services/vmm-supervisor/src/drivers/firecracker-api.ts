/**
 * A minimal client of the Firecracker API (HTTP/1.1 over the VMM's unix socket) and the
 * request sequence that configures and boots a VM.
 */
import http from 'node:http';
import { InternalError } from '@sandnode/shared';

/** Longest one API request may take, in ms. */
export const DEFAULT_FC_API_TIMEOUT_MS = 5_000;
/** The guest CID of every VM: each VM has its own vsock UDS on the host, so CIDs need not differ. */
export const FC_GUEST_CID = 3;

/** FcRequest is one API call. */
export interface FcRequest {
  method: 'GET' | 'PUT' | 'PATCH';
  path: string;
  body?: unknown;
}

/** FcResponse is an API answer: HTTP status and the parsed JSON body (undefined when empty). */
export interface FcResponse {
  status: number;
  body: unknown;
}

/** FirecrackerApi calls one VMM's API socket. */
export class FirecrackerApi {
  constructor(
    readonly socketPath: string,
    readonly timeoutMs = DEFAULT_FC_API_TIMEOUT_MS,
  ) {}

  /**
   * call sends req and resolves with the answer; any status >= 300 or a transport failure
   * rejects with an InternalError naming the method, path and Firecracker's fault_message.
   */
  call(req: FcRequest): Promise<FcResponse> {
    const payload = req.body === undefined ? undefined : JSON.stringify(req.body);
    return new Promise<FcResponse>((resolve, reject) => {
      const r = http.request(
        {
          socketPath: this.socketPath,
          method: req.method,
          path: req.path,
          headers: {
            Accept: 'application/json',
            ...(payload === undefined ? {} : { 'Content-Type': 'application/json', 'Content-Length': Buffer.byteLength(payload) }),
          },
          timeout: this.timeoutMs,
        },
        (res) => {
          const chunks: Buffer[] = [];
          res.on('data', (c: Buffer) => chunks.push(c));
          res.on('end', () => {
            const text = Buffer.concat(chunks).toString('utf8');
            let body: unknown;
            try {
              body = text ? JSON.parse(text) : undefined;
            } catch {
              body = text;
            }
            const status = res.statusCode ?? 0;
            if (status >= 300) {
              const fault = (body as { fault_message?: string } | undefined)?.fault_message ?? text;
              reject(new InternalError(`firecracker API ${req.method} ${req.path}: HTTP ${status}: ${fault}`));
              return;
            }
            resolve({ status, body });
          });
          res.on('error', (err) => reject(new InternalError(`firecracker API ${req.method} ${req.path}: ${err.message}`)));
        },
      );
      r.on('timeout', () => r.destroy(new Error(`no answer in ${this.timeoutMs} ms`)));
      r.on('error', (err) => reject(new InternalError(`firecracker API ${req.method} ${req.path} on ${this.socketPath}: ${err.message}`)));
      r.end(payload);
    });
  }

  /** state returns InstanceInfo.state of `GET /`: "Not started", "Running" or "Paused". */
  async state(): Promise<string> {
    const { body } = await this.call({ method: 'GET', path: '/' });
    return String((body as { state?: unknown } | undefined)?.state ?? '');
  }
}

/** BootPlan is what the boot sequence needs; every path is an absolute host path. */
export interface BootPlan {
  kernelImage: string;
  kernelArgs: string;
  /** Template rootfs image: read-only root device. */
  rootfsImage: string;
  /** The rootfs-upper drive (writable). */
  upperDrive: string;
  /** The workspace drive, if any. */
  workspaceDrive?: { path: string; readOnly: boolean };
  vcpus: number;
  memoryMib: number;
  /** Host UDS of the VM's vsock device. */
  vsockPath: string;
  /** The VM's network: the tap (in the slot's netns, where the VMM runs) and the guest's address; undefined = none. */
  network?: { tap: string; address: string; gateway: string; prefixLen: number };
}

/** guestMac is a stable locally administered MAC for a guest address ("06:00:" + its 4 bytes). */
export function guestMac(address: string): string {
  return ['06', '00', ...address.split('.').map((b) => Number(b).toString(16).padStart(2, '0'))].join(':');
}

/** netmask is the dotted mask of a prefix length. */
function netmask(prefix: number): string {
  const m = prefix === 0 ? 0 : (0xffffffff << (32 - prefix)) >>> 0;
  return [m >>> 24, (m >>> 16) & 255, (m >>> 8) & 255, m & 255].join('.');
}

/**
 * guestIpArg is the kernel's static configuration of the guest's eth0 (Documentation/
 * admin-guide/nfs/nfsroot.rst `ip=<client>:<server>:<gw>:<netmask>:<host>:<dev>:<autoconf>`),
 * e.g. "ip=10.209.0.2::10.209.0.1:255.255.255.252::eth0:off".
 */
export function guestIpArg(n: { address: string; gateway: string; prefixLen: number }): string {
  return `ip=${n.address}::${n.gateway}:${netmask(n.prefixLen)}::eth0:off`;
}

/**
 * bootRequests returns the API calls that configure and start a VM, in order: boot source,
 * drives (rootfs, upper, workspace), machine config, the network interface (guest eth0 on the
 * tap; its address in the kernel's ip= argument), vsock, InstanceStart. Pure.
 */
export function bootRequests(p: BootPlan): FcRequest[] {
  const reqs: FcRequest[] = [
    { method: 'PUT', path: '/boot-source', body: { kernel_image_path: p.kernelImage, boot_args: p.network ? `${p.kernelArgs} ${guestIpArg(p.network)}` : p.kernelArgs } },
    { method: 'PUT', path: '/drives/rootfs', body: { drive_id: 'rootfs', path_on_host: p.rootfsImage, is_root_device: true, is_read_only: true } },
    { method: 'PUT', path: '/drives/upper', body: { drive_id: 'upper', path_on_host: p.upperDrive, is_root_device: false, is_read_only: false } },
  ];
  if (p.workspaceDrive) {
    reqs.push({
      method: 'PUT',
      path: '/drives/workspace',
      body: { drive_id: 'workspace', path_on_host: p.workspaceDrive.path, is_root_device: false, is_read_only: p.workspaceDrive.readOnly },
    });
  }
  reqs.push(
    { method: 'PUT', path: '/machine-config', body: { vcpu_count: p.vcpus, mem_size_mib: p.memoryMib } },
    ...(p.network ? [{ method: 'PUT' as const, path: '/network-interfaces/eth0', body: { iface_id: 'eth0', host_dev_name: p.network.tap, guest_mac: guestMac(p.network.address) } }] : []),
    { method: 'PUT', path: '/vsock', body: { guest_cid: FC_GUEST_CID, uds_path: p.vsockPath } },
    { method: 'PUT', path: '/actions', body: { action_type: 'InstanceStart' } },
  );
  return reqs;
}

/** bootVm sends the boot sequence of plan through api, stopping at the first failure. */
export async function bootVm(api: FirecrackerApi, plan: BootPlan): Promise<void> {
  for (const req of bootRequests(plan)) await api.call(req);
}

/** The request that pauses (`Paused`) or resumes (`Resumed`) a VM. */
export function vmStateRequest(state: 'Paused' | 'Resumed'): FcRequest {
  return { method: 'PATCH', path: '/vm', body: { state } };
}

/** The request that asks the guest to shut down (x86 keyboard reset). */
export const CTRL_ALT_DEL: FcRequest = { method: 'PUT', path: '/actions', body: { action_type: 'SendCtrlAltDel' } };
