#!/usr/bin/perl
# Turns one kernels/*.cu file into host C++ for the cuda_cpu scheduler (cuda_runtime.h):
#   name<targs><<<cfg>>>(args);   ->
#   cucpu_launch(CUCPU_CFG(cfg), [cucpu_args = std::make_tuple(args)]() {
#       std::apply(name<targs>, cucpu_args); });
# (also inside a macro, across its backslash-newlines): the arguments are evaluated when the
# launch is made, as CUDA does (a graph node keeps those values), and the kernel runs on the
# copies; and
#   extern __shared__ T name[];   ->   T *name = (T *)cucpu_dynamic_shared();
# (the launch's dynamic shared memory, sized by cfg's third argument).
# Nothing else changes, so the compiled code is the kernel source itself.
# usage: to_host.pl IN.cu OUT.cc
use strict;
use warnings;
my ($in, $out) = @ARGV;
open(my $fh, '<', $in) or die "to_host.pl: $in: $!\n";
local $/;
my $src = <$fh>;
close $fh;
my $gap = qr/(?:\s|\\\n)*/;
my $parens = qr/(\((?:[^()]++|(?-1))*\))/;
my $count = ($src =~ s{((?:\w+::)*\w+(?:<[^<>;(){}]*>)?)$gap<<<(.*?)>>>$gap$parens}
                      {cucpu_launch(CUCPU_CFG($2), [cucpu_args = std::make_tuple$3]() { std::apply($1, cucpu_args); })}gs);
$src =~ s{extern\s+__shared__\s+(\w+)\s+(\w+)\s*\[\s*\]\s*;}
         {$1 *$2 = ($1 *)cucpu_dynamic_shared();}g;
die "to_host.pl: $in: a <<< launch was left unconverted\n" if $src =~ /<<</;
open(my $oh, '>', $out) or die "to_host.pl: $out: $!\n";
print $oh "// Generated from $in by kernels/cuda_cpu/to_host.pl ($count launches).\n";
print $oh "#line 1 \"$in\"\n$src";
close $oh;
