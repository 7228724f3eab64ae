/**
 * The Cella SDK for Java: sandboxes on a Cella server and what runs in them.
 *
 * <p>Start from {@link io.cella.Sandbox}: {@link io.cella.Sandbox#create(io.cella.CreateOptions)}
 * makes one, and {@link io.cella.Sandbox#commands()}, {@link io.cella.Sandbox#files()}, {@link
 * io.cella.Sandbox#code()} and {@link io.cella.Sandbox#pty} work in it. Workspace-wide objects have
 * classes of static methods: {@link io.cella.Snapshot}, {@link io.cella.Artifact}, {@link
 * io.cella.Template}, {@link io.cella.Task} (task runs), {@link io.cella.Workspace} (settings,
 * wallet, ledger, usage), {@link io.cella.ApiKey}, {@link io.cella.Member}, {@link
 * io.cella.User}, {@link io.cella.Image}, {@link io.cella.Server}.
 *
 * <p>Options are built with builders ({@link io.cella.CreateOptions}, {@link
 * io.cella.ExecOptions}, {@link io.cella.RunOptions}, {@link io.cella.TaskOptions}, {@link
 * io.cella.ListOptions}); live output comes as iterators that are also {@link java.util.stream.Stream}s and {@link
 * java.util.concurrent.Flow.Publisher}s
 * ({@link io.cella.CommandStream}, {@link io.cella.WatchHandle}, {@link io.cella.EventIterator});
 * file contents as {@link java.io.InputStream}/{@link java.io.OutputStream}. Errors are unchecked
 * {@link io.cella.CellaException}s, one subclass per family; only the streams throw {@link
 * java.io.IOException}. Every object is safe to share between threads, except the iterators and
 * streams, which belong to one reader.
 */
package io.cella;
