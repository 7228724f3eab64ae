// Images imported from archives (for custom templates), and users (the operator's).

import { request } from './http.js';
import { camelize } from './convert.js';
import { checkOptions } from './options.js';
import { configOf } from './resources.js';
import { uploadBody } from './files.js';
import type { ConnectionOptions, FileData, ImageInfo, UserCreateOptions, UserInfo } from './types.js';

type Opts = ConnectionOptions & { signal?: AbortSignal };

/** Images imported from an OCI layout or a `docker save` tarball, for templates to build on. */
export class Image {
  /** The workspace's imported images, oldest first. */
  static async list(opts: Opts = {}): Promise<ImageInfo[]> {
    const r = await request(configOf(opts), 'GET', '/images', { signal: opts.signal });
    return (r.data as unknown[]).map((raw) => camelize<ImageInfo>(raw));
  }

  /**
   * Imports an image from a tar archive (bytes, a Blob or a stream); a template then builds on
   * it with `image: info.reference`. Scope `templates:write`.
   */
  static async importTar(data: FileData, opts: Opts & { name?: string } = {}): Promise<ImageInfo> {
    const body = uploadBody(data);
    const r = await request(configOf(opts), 'POST', '/images', {
      query: { name: opts.name },
      body,
      headers: { 'content-type': 'application/x-tar' },
      signal: opts.signal,
      timeoutMs: null,
    });
    return camelize<ImageInfo>(r.data);
  }

  /** Deletes an imported image; returns it as it was. */
  static async delete(imageId: string, opts: Opts = {}): Promise<ImageInfo> {
    const r = await request(configOf(opts), 'DELETE', `/images/${encodeURIComponent(imageId)}`, { signal: opts.signal });
    return camelize<ImageInfo>(r.data);
  }
}

/** Users: the people who sign in to the console. */
export class User {
  /**
   * Makes a user with their personal workspace (the operator only, or anyone where the server
   * allows sign-up); ConflictError for a taken email.
   */
  static async create(opts: UserCreateOptions): Promise<UserInfo> {
    const o = checkOptions(opts, ['email', 'name', 'password'], 'User.create');
    const r = await request(configOf(o), 'POST', '/users', {
      json: { email: o.email, name: o.name, password: o.password },
      signal: o.signal,
    });
    return camelize<UserInfo>(r.data);
  }
}
