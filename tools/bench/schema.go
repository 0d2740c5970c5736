package main

import (
	"context"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/oncekit/oncekit/migrate"
)

// freshSchema recreates schema with oncekit's tables and the benchmark's own (ddl, run
// with search_path set to the schema), and returns a pool on it.
func freshSchema(ctx context.Context, url, schema, ddl string) (*pgxpool.Pool, error) {
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return nil, err
	}
	defer conn.Close(ctx)
	ident := pgx.Identifier{schema}.Sanitize()
	if _, err := conn.Exec(ctx, "DROP SCHEMA IF EXISTS "+ident+" CASCADE"); err != nil {
		return nil, err
	}
	if _, err := migrate.Up(ctx, conn, schema); err != nil {
		return nil, err
	}
	if _, err := conn.Exec(ctx, "SET search_path TO "+ident+"; "+ddl); err != nil {
		return nil, err
	}
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, err
	}
	cfg.ConnConfig.RuntimeParams["search_path"] = schema
	return pgxpool.NewWithConfig(ctx, cfg)
}
