"""The analyses' libraries: no flags, so that any of them imports beside any other. A
module that makes a kind of result holds its renderer (`RENDERERS`, found by
`experiments.rendering`)."""
